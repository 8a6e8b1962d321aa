"""The shape of the code, as a reader sees it: the top level is the reader's path and one script per figure; the rest
lives in packages that depend only downwards (kernels <- the reader's path <- plumbing <- engine <- train <- analysis
<- runners <- campaigns <- the model files <- the scripts); nothing imports a figure script; no import cycle; no file past ~500 lines without a reason; and the README's
reading order names what its files define.

Read from the source with ast, not by importing: an import inside a function (train.py's speed block, a lazy import of
scipy's or a script's) counts like one at the top."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("kernels", "plumbing", "engine", "analysis", "runners", "campaigns")
READERS_PATH = ("markov", "bayes", "transformer", "evaluation", "train")
SCRIPTS = ("predictor_scaling", "sweep", "circuits", "task_vectors", "sa_dynamics", "sa_scaling", "tau_settings",
           "tau_velocities", "mem_minimal", "k1", "k2")
MODELS = ("sa_transformer", "sa_hybrids")  # the paper's second model, its theory and training: the file of Figs.
# 5-6's two scripts and of the two studies of why the transformer's tau(N) is flat, which a figure script may not hold
# since none imports another; and its hybrids with the transformer's parts (tau_settings.py's ladder)
# each top-level module or package, by level: a module may import its own level and those below, never one above
LEVELS = [("kernels",), ("markov", "bayes", "transformer", "evaluation"), ("plumbing",), ("engine",), ("train",),
          ("analysis",), ("runners",), ("campaigns",), MODELS, SCRIPTS]
# the reader's path: each may import only the modules of the path before it (and torch, numpy, the standard library)
READER = {"markov": set(), "bayes": {"markov"}, "transformer": set(), "evaluation": {"markov", "bayes", "transformer"}}
# train.py: the reader's path and the plumbing (command line, run directories) at the top; the engine only in its
# speed block, inside `train`
TRAIN_TOP = {"markov", "bayes", "transformer", "evaluation", "plumbing.cli", "plumbing.rundir", "plumbing.style"}
TRAIN_ENGINE = {"train": {"engine.ensemble"}}
# the files past ~500 lines, and why a reader would accept it
LONG = {"kernels/attention.py": "the fused attention as the Triton tutorials lay one out: forward and backward kernels, "
                                "the autograd wrapper and the tile choice, top to bottom"}
MAX_LINES = 500


def modules(root: str = ROOT) -> dict[str, str]:
    """{dotted module name: path} of the top-level .py files and of every package's modules (tests and bench aside)."""
    found = {f[:-3]: os.path.join(root, f) for f in os.listdir(root) if f.endswith(".py")}
    for package in PACKAGES:
        folder = os.path.join(root, package)
        for f in os.listdir(folder) if os.path.isdir(folder) else []:
            if f.endswith(".py") and f != "__init__.py":
                found[f"{package}.{f[:-3]}"] = os.path.join(folder, f)
    return found


def imports(path: str, ours: set[str]) -> tuple[set[str], dict[str, set[str]]]:
    """(the repository's modules imported at module level, {function: the modules imported inside it}), each as the
    dotted name of a module in `ours` (`from engine import fastdata` and `import engine.fastdata` alike)."""
    tree = ast.parse(open(path).read())

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in ours), None)

    def names(node) -> set[str]:
        if isinstance(node, ast.Import):
            found = {resolve(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = {resolve(f"{node.module}.{a.name}") or resolve(node.module) for a in node.names}
        else:
            return set()
        return found - {None}

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


def graph(root: str = ROOT) -> dict[str, set[str]]:
    """Every import of every module, at the top or inside a function."""
    found = modules(root)
    edges = {}
    for name, path in found.items():
        top, inner = imports(path, set(found))
        edges[name] = top.union(*inner.values()) - {name}
    return edges


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


def level(module: str) -> int:
    top = module.split(".")[0]
    return next(i for i, names in enumerate(LEVELS) if top in names)


def test_the_top_level_is_the_readers_path_the_models_and_one_script_per_figure():
    top = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}
    want = set(READERS_PATH) | set(MODELS) | set(SCRIPTS)
    assert top == want, f"unexpected at the top: {sorted(top ^ want)}"


def importing_scripts(root: str = ROOT) -> list[str]:
    """Every import of a figure script, by any module (a package's as much as another script's)."""
    return sorted(f"{a} -> {b}" for a, targets in graph(root).items() for b in targets if b in SCRIPTS)


def test_nothing_imports_a_figure_script():
    """What a script shares lives below it (the reader's path, a model file or a package): a campaign runs a
    script by its command line, and each script draws its own campaigns' ledgers."""
    assert not importing_scripts(), importing_scripts()


def test_a_script_imported_inside_a_function_is_seen(tmp_path):
    (tmp_path / "task_vectors.py").write_text("def main():\n    from circuits import circuit_edges\n")
    (tmp_path / "circuits.py").write_text("import markov\n")
    (tmp_path / "campaigns").mkdir()
    (tmp_path / "campaigns" / "campaign.py").write_text("def report():\n    import k1\n")
    (tmp_path / "k1.py").write_text("")
    assert importing_scripts(str(tmp_path)) == ["campaigns.campaign -> k1", "task_vectors -> circuits"]


def test_every_module_has_a_level():
    assert all(level(m) >= 0 for m in modules())


def test_no_import_cycle_counting_imports_inside_functions():
    found = cycle(graph())
    assert found is None, " -> ".join(found)


def test_no_import_points_up():
    up = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets if level(b) > level(a))
    assert not up, up


def test_the_walk_sees_a_cycle_through_a_function_level_import(tmp_path):
    """The walk itself: a cycle closed only by an import inside a function (train.py's grid dispatch once did it)."""
    (tmp_path / "train.py").write_text("def main():\n    from runners import grids\n")
    (tmp_path / "runners").mkdir()
    (tmp_path / "runners" / "grids.py").write_text("import train\n")
    assert cycle(graph(str(tmp_path))) == ["runners.grids", "train", "runners.grids"]
    assert level("runners.grids") > level("train")  # and that import points up


def test_the_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("module", sorted(READER))
def test_the_readers_path_imports_nothing_of_the_engine(module):
    top, inner = imports(os.path.join(ROOT, f"{module}.py"), set(modules()))
    everything = top.union(*inner.values())
    assert everything <= READER[module], f"{module}.py imports {sorted(everything - READER[module])}"


def test_train_reaches_the_engine_only_in_its_speed_block():
    top, inner = imports(os.path.join(ROOT, "train.py"), set(modules()))
    assert top <= TRAIN_TOP, f"train.py imports {sorted(top - TRAIN_TOP)} at the top"
    for function, found in inner.items():
        assert found <= TRAIN_ENGINE.get(function, set()), f"train.{function} imports {sorted(found)}"


def test_the_kernels_import_nothing_of_ours():
    for name, path in modules().items():
        if name.startswith("kernels."):
            top, inner = imports(path, set(modules()))
            assert all(m.startswith("kernels.") for m in top.union(*inner.values())), f"{name} imports {sorted(top)}"


def test_imports_inside_functions_are_seen(tmp_path):
    """The walk itself: a function-level import, and one under `if` at module level."""
    path = tmp_path / "m.py"
    path.write_text("import os\nif True:\n    import markov\n\ndef f():\n    if 1:\n        from runners import grids\n")
    assert imports(str(path), {"markov", "runners.grids"}) == ({"markov"}, {"f": {"runners.grids"}})


def test_no_file_past_500_lines_without_a_reason():
    long = {os.path.relpath(p, ROOT): n for p in modules().values() if (n := sum(1 for _ in open(p))) > MAX_LINES}
    assert set(long) <= set(LONG), f"past {MAX_LINES} lines with no reason in LONG: {long}"


# ----------------------------------------------------------------------------- the README's reading order

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


def reading_order() -> list[tuple[str, str]]:
    """(file, name) for every function, class or constant the README's reading order names: each item names its
    files and then what to read in them; a name is looked up in the item's file that defines it."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index("## Reading order"):]
    section = section[: section.index("\n## ", 3)]
    found = []
    for item in re.split(r"\n(?=\d+\. |- )", section)[1:]:
        paths = re.findall(r"`([\w/]+\.py)`", item)
        for name in re.findall(r"`([A-Za-z_][\w.]*)`", item):
            if not name.endswith(".py"):
                defining = [p for p in paths if name in spans(os.path.join(ROOT, p))]
                found.append((defining[0] if defining else paths[0], name))
    return found


def test_the_reading_order_names_every_file_of_the_readers_path_and_every_script():
    named = {path for path, _ in reading_order()}
    assert {f"{m}.py" for m in READERS_PATH} | {f"{m}.py" for m in SCRIPTS} <= named, "a file the reading order skips"


@pytest.mark.parametrize("path, name", reading_order())
def test_the_reading_order_names_what_its_files_define(path, name):
    assert name in spans(os.path.join(ROOT, path)), f"README's reading order: {path} has no {name}"
