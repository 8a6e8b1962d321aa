"""How every figure and message writes the four Bayes predictors of bayes.py (Sec. "Bayes-optimal predictors"): their
names as the paper writes them and one colour each, the same in every figure."""
LABELS = {"1gen": "1-Gen", "2gen": "2-Gen", "1mem": "1-Mem", "2mem": "2-Mem"}
COLORS = {"1gen": "tab:green", "2gen": "tab:blue", "1mem": "tab:orange", "2mem": "tab:red"}
