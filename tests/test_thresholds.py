"""thresholds.py: the K1* search on synthetic monotone rules, and the rule read from metrics rows."""
import pytest

import thresholds
from thresholds import PHI_STAR, Search, max_phi_beta, search_threshold, tau_2gen


@pytest.mark.parametrize("true_K1", [16, 17, 40, 93, 94, 127])
def test_search_finds_the_threshold_of_a_monotone_rule(true_K1):
    calls = []

    def generalizes(K):
        calls.append(K)
        return K > true_K1

    result = search_threshold(generalizes, 16, 128)
    assert result["K1_star"] == true_K1 and result["bound"] is None
    assert len(calls) == len(set(calls)) <= 2 + 7  # lo, hi, then ~log2(112) midpoints
    assert all(result["probes"][K] == (K > true_K1) for K in calls)


def test_search_reports_never_and_always():
    assert search_threshold(lambda K: True, 16, 128) == {"K1_star": None, "bound": "below", "probes": {16: True, 128: True}}
    never = search_threshold(lambda K: False, 16, 128)
    assert never["K1_star"] is None and never["bound"] == "above"
    with pytest.raises(ValueError, match="lo < hi"):
        Search(8, 8)


def test_lockstep_search_probes_both_ends_first():
    search = Search(10, 20)
    assert search.pending() == [10, 20]
    search.record(10, False)
    assert search.pending() == [20]
    search.record(20, True)
    assert search.pending() == [15]
    with pytest.raises(ValueError, match="not finished"):
        search.result()


def test_the_rule_reads_max_phi_beta_from_the_rows_up_to_T():
    rows = [{"step": 0, "phi_beta_2": 0.1}, {"step": 100, "phi_beta_2": 0.5}, {"step": 200, "phi_beta_2": 0.3},
            {"step": 300, "phi_beta_2": 0.9}]
    assert max_phi_beta(rows) == 0.9
    assert max_phi_beta(rows, iters=250) == 0.5
    assert max_phi_beta(rows[::-1], iters=99) == 0.1
    assert tau_2gen(rows) == 100 and tau_2gen(rows, phi_star=0.6) == 300 and tau_2gen(rows, phi_star=0.95) is None
    assert tau_2gen([{"step": 5, "phi_beta_2": PHI_STAR}]) is None  # "exceeds": equality is not 2-Gen
    with pytest.raises(ValueError):
        max_phi_beta(rows, iters=-1)
