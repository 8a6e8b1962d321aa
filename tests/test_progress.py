"""cli.parallel_map's progress lines: the ETA from the work done, counted in each job's cost, so that jobs of
unequal length (mem_minimal.py --trend: 1500 to 12000 steps) get an honest estimate."""
import types

import pytest

from plumbing import cli


def _square(x):
    return x * x


@pytest.mark.parametrize("cost, eta", [(None, "ETA 1.0 min"), ([1, 3], "ETA 3.0 min")])
def test_the_eta_counts_the_cost_of_the_jobs_left(monkeypatch, capsys, cost, eta):
    clock = iter([0.0, 60.0, 100.0])  # start, first job done, second job done
    monkeypatch.setattr(cli, "time", types.SimpleNamespace(time=lambda: next(clock)))
    assert cli.parallel_map(_square, [2, 3], 1, progress="jobs", cost=cost) == [4, 9]
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"jobs: 1/2 done, 1.0 min, {eta}", "jobs: 2/2 done, 1.7 min, ETA 0.0 min"]


def test_a_cost_per_job():
    with pytest.raises(ValueError, match="2 costs for 3 jobs"):
        cli.parallel_map(_square, [1, 2, 3], 1, cost=[1, 2])
