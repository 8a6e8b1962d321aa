"""How the figures, messages and tables write things: the four Bayes predictors of bayes.py (Appendix "Defining
the four algorithmic phases") by their names in the paper and one colour each, the same in every figure; numbers as
the results' tables write them."""
LABELS = {"1gen": "1-Gen", "2gen": "2-Gen", "1mem": "1-Mem", "2mem": "2-Mem"}
COLORS = {"1gen": "tab:green", "2gen": "tab:blue", "1mem": "tab:orange", "2mem": "tab:red"}


def number(x: float | None, digits: int = 2) -> str:
    """A number as the results' tables write it: fixed digits, a typographic minus, and a dash for none."""
    return "—" if x is None else f"{x:.{digits}f}".replace("-", "−")
