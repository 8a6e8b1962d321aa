"""The shape of the code: dependencies point one way (markov <- bayes <- transformer <- evaluation <- train <- the
engine and the analysis scripts), no import cycle among the top-level modules, no file past ~500 lines without a
reason, and the README's reading order naming the lines where its functions are.

Read from the source with ast, not by importing: an import that only happens inside a function (train.py's speed
block, its grid dispatch) is seen too."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = sorted(f[:-3] for f in os.listdir(ROOT) if f.endswith(".py"))

# the reader's path: each may import only the modules of the path before it (and torch, numpy, the standard library)
READER = {"markov": set(), "bayes": {"markov"}, "transformer": set(), "evaluation": {"markov", "bayes", "transformer"}}
# train.py: the reader's path, the command line and the run-directory bookkeeping at the top; the engine only
# inside these functions (the speed block of `train`, the grids of `main`)
TRAIN_TOP = {"markov", "bayes", "transformer", "evaluation", "cli", "rundir"}
TRAIN_ENGINE = {"train": {"ensemble"}, "main": {"grids"}}
# the files past ~500 lines, and why a reader would accept it
LONG = {"mem_minimal.py": "Fig. 8d-f end to end: the minimal model, its training, the K2_hat searches with their run-time "
                          "estimate, and the three figures drawn from one JSON",
        "trace.py": "Figs. 3, A2, A3 end to end: the explicit forward over Table I's edges, their importance, the phases' "
                    "checkpoints, and the circuit graphs with the one rule that chooses their edges"}
MAX_LINES = 500


def imports(path: str) -> tuple[set[str], dict[str, set[str]]]:
    """(the repository's modules imported at module level, {function: the modules imported inside it})."""
    tree = ast.parse(open(path).read())
    ours = set(MODULES) | {"kernels"}

    def names(node) -> set[str]:
        if isinstance(node, ast.Import):
            found = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = {node.module.split(".")[0]}
        else:
            return set()
        return found & ours

    top, inner = set(), {}

    def visit(node, function: str | None):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, function or child.name)
            else:
                found = names(child)
                if function is None:
                    top.update(found)
                elif found:
                    inner.setdefault(function, set()).update(found)
                visit(child, function)

    visit(tree, None)
    return top, inner


def graph() -> dict[str, set[str]]:
    return {m: imports(os.path.join(ROOT, f"{m}.py"))[0] - {m} for m in MODULES}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph, as a list of nodes, or None."""
    state, stack = {}, []

    def dfs(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_no_import_cycle_among_the_top_level_modules():
    assert cycle(graph()) is None, " -> ".join(cycle(graph()))


def test_the_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("module", sorted(READER))
def test_the_readers_path_imports_nothing_of_the_engine(module):
    top, inner = imports(os.path.join(ROOT, f"{module}.py"))
    everything = top.union(*inner.values())
    assert everything <= READER[module], f"{module}.py imports {sorted(everything - READER[module])}"


def test_train_reaches_the_engine_only_in_its_speed_block_and_for_grids():
    top, inner = imports(os.path.join(ROOT, "train.py"))
    assert top <= TRAIN_TOP, f"train.py imports {sorted(top - TRAIN_TOP)} at the top"
    for function, found in inner.items():
        assert found <= TRAIN_ENGINE.get(function, set()), f"train.{function} imports {sorted(found)}"


def test_the_kernels_import_nothing_of_ours():
    folder = os.path.join(ROOT, "kernels")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            top, inner = imports(os.path.join(folder, name))
            assert top.union(*inner.values()) <= {"kernels"}, f"kernels/{name} imports {sorted(top)}"


def test_imports_inside_functions_are_seen(tmp_path):
    """The walk itself: a function-level import, and one under `if` at module level."""
    path = tmp_path / "m.py"
    path.write_text("import os\nif True:\n    import markov\n\ndef f():\n    if 1:\n        from grids import x\n")
    assert imports(str(path)) == ({"markov"}, {"f": {"grids"}})


def test_no_file_past_500_lines_without_a_reason():
    long = {f"{m}.py": n for m in MODULES if (n := sum(1 for _ in open(os.path.join(ROOT, f"{m}.py")))) > MAX_LINES}
    assert set(long) <= set(LONG), f"past {MAX_LINES} lines with no reason in LONG: {long}"


# ----------------------------------------------------------------------------- the README's reading order

NAMES = r"`[\w.]+`(?:(?:, | / | and )`[\w.]+`)*"  # one name, or a group whose range spans them all
RANGE = re.compile(rf"({NAMES}) (\d+)(?:-(\d+))?(?!\d)")


def spans(path: str) -> dict[str, tuple[int, int]]:
    """Every function, class (with its methods, and a function's inner functions, as outer.name) and module-level
    assignment of a file: its lines."""
    tree = ast.parse(open(path).read())
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = (node.lineno, node.end_lineno)
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef) and item is not node:
                    out.setdefault(f"{node.name}.{item.name}", (item.lineno, item.end_lineno))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    out[target.id] = (node.lineno, node.end_lineno)
    return out


def reading_order() -> list[tuple[str, str, int, int]]:
    """(file, names, first line, last line) of every range the README's reading-order tables give."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index("## Reading order"):]
    section = section[: section.index("\n## ", 3)]
    found = []
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) > 3 and cells[1].strip().startswith("`"):
            for path in re.findall(r"`([\w/]+\.py)`", cells[1]):
                for names, a, b in RANGE.findall(cells[3]):
                    found.append((path, names, int(a), int(b or a)))
    return found


def test_the_reading_order_names_ranges():
    assert len(reading_order()) >= 30


@pytest.mark.parametrize("path, names, first, last", reading_order())
def test_reading_order_ranges_are_where_the_functions_are(path, names, first, last):
    where = spans(os.path.join(ROOT, path))
    listed = re.findall(r"`([\w.]+)`", names)
    missing = [n for n in listed if n not in where]
    assert not missing, f"{path} has no {missing}"
    want = (where[listed[0]][0], where[listed[-1]][1])
    assert (first, last) == want, f"README: {names} {first}-{last}; {path}: {want[0]}-{want[1]}"
