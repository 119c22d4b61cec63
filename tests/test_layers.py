"""The house: labutils in layer folders whose imports point one way, and notebooks that load only
what they use. These read the source (every import, at the top or inside a function) and run fresh
interpreters; they change nothing."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "labutils"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# Lowest first: a module may import its own layer and any layer to its left, never one to its right.
LAYERS = ("core", "readers", "model", "measure", "experiments", "show", "doctor", "course")
# Importable without torch at all (and so without torch.distributed, a launcher or a GPU).
TORCH_FREE = ("core", "readers", "model")
# How many labutils modules each notebook's import statements load, at most: today's counts, so no
# notebook grows. The limit is MODULE_LIMIT for every notebook; NOT_YET_WITHIN_LIMIT names the ones
# still above it (the sweep and the doctor behind 01/02, the sweep and the split-layer experiments
# behind 07/08), and a notebook leaves that set once its count is within the limit.
MODULE_LIMIT = 20
NOTEBOOK_MODULE_CEILINGS = {"00_check_your_machine": 7, "01_topology": 25, "02_allreduce_sweep": 30,
                            "04_ring_by_hand": 18, "05_predicting_allreduce": 22, "06_tensor_parallel": 23,
                            "08_time_budget": 19, "09_validating_the_budget": 30, "10_data_parallel_training": 28,
                            "03_nccl_transports": 20, "07_backward_and_precision": 20,
                            "11_ddp_by_hand": 24}
NOT_YET_WITHIN_LIMIT = {"01_topology", "02_allreduce_sweep", "05_predicting_allreduce", "06_tensor_parallel",
                        "09_validating_the_budget", "10_data_parallel_training", "11_ddp_by_hand"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """`labutils.model.fit` -> 'model'; the package root and the CLI are 'top'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "top"


def rank(layer: str) -> int:
    return LAYERS.index(layer) if layer in LAYERS else len(LAYERS)


def imports_of(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) for every labutils import in `path`, inside functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("labutils")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labutils"):
            found.append((node.module, [a.name for a in node.names], node.lineno))
    return found


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_sits_in_a_layer_folder():
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "__main__.py", "cli.py"}]
    assert not loose, f"modules outside a layer folder: {loose}"
    assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(LAYERS)


def test_imports_point_down_the_layers():
    wrong = []
    for path in sources():
        here = layer_of(module_name(path))
        for module, names, line in imports_of(path):
            targets = [module] if module != "labutils" else [f"labutils.{n}" for n in names]
            for target in targets:
                if rank(layer_of(target)) > rank(here):
                    wrong.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {target}")
    assert not wrong, "imports that run up the layers:\n" + "\n".join(wrong)


def test_the_layer_rule_catches_an_arrow_up():
    assert rank(layer_of("labutils.show.plots")) > rank(layer_of("labutils.model.budget"))
    assert layer_of("labutils.cli") == "top" and layer_of("labutils.core") == "core"


def test_no_module_imports_another_modules_private_name():
    private = []
    for path in sources():
        for module, names, line in imports_of(path):
            private += [f"{path.relative_to(ROOT)}:{line} takes {module}.{n}" for n in names if n.startswith("_")]
    assert not private, "\n".join(private)


def test_every_module_imports():
    code = ("import importlib, pkgutil, labutils\n"
            "for m in pkgutil.walk_packages(labutils.__path__, 'labutils.'):\n    importlib.import_module(m.name)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=180)


BLOCK_TORCH = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} is blocked: this layer must not need it")
sys.meta_path.insert(0, Block())
"""


@pytest.mark.parametrize("layer", TORCH_FREE)
def test_lower_layers_import_without_torch(layer):
    modules = [module_name(p) for p in sorted((PACKAGE / layer).glob("*.py"))]
    code = BLOCK_TORCH + "".join(f"import {m}\n" for m in modules)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]


def notebook_imports(path: Path) -> str:
    """The import statements of a notebook's code cells, one per line (continuations kept)."""
    lines = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        tree = ast.parse("".join(cell["source"]))
        src = "".join(cell["source"]).splitlines()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                lines.append("\n".join(src[node.lineno - 1:node.end_lineno]))
    return "\n".join(lines)


# Every module of the package counts (labutils.doctor.doctor too); the layer packages themselves do not.
# One interpreter imports the notebooks' heavy third-party packages once (no labutils module), then
# forks a child per notebook: each child starts with no labutils module loaded, runs the notebook's
# import statements and reports what they loaded. As fresh as a new interpreter for what is counted,
# without importing torch nine times.
FORKING = """
import json, os, sys
import matplotlib, numpy, pandas, torch  # noqa: F401 - loaded once, before any fork
assert not [m for m in sys.modules if m.startswith("labutils")]
codes, found = json.loads(sys.stdin.read()), {}
for stem, code in codes.items():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        with os.fdopen(write, "w") as out:
            try:
                exec(compile(code, stem, "exec"), {"__name__": "__main__"})
                out.write(repr(sorted(m for m in sys.modules if m.startswith("labutils.") and m.count(".") == 2)))
                status = 0
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                out.write("ERROR " + repr(exc))
                status = 1
        os._exit(status)
    os.close(write)
    with os.fdopen(read) as got:
        text = got.read()
    found[stem] = (text, os.waitpid(pid, 0)[1] >> 8)
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def notebook_loads() -> dict:
    """{notebook stem: (what its import statements loaded, as a repr'd list; "", exit status)}: each
    notebook's imports run in a child forked before any labutils module was loaded (FORKING)."""
    codes = {p.stem: notebook_imports(p) for p in NOTEBOOKS}
    done = subprocess.run([sys.executable, "-c", FORKING], input=json.dumps(codes), cwd=ROOT, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {stem: (text, "" if status == 0 else text, status) for stem, (text, status) in found.items()}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_notebook_loads_only_what_it_uses(path, notebook_loads):
    out, err, status = notebook_loads[path.stem]
    assert status == 0, err[-2000:]
    loaded = ast.literal_eval(out.strip().splitlines()[-1])
    ceiling = NOTEBOOK_MODULE_CEILINGS[path.stem]
    assert len(loaded) <= ceiling, f"{path.name} loads {len(loaded)} labutils modules (at most {ceiling}): {loaded}"
    if path.stem in NOT_YET_WITHIN_LIMIT:
        assert len(loaded) > MODULE_LIMIT, f"{path.name} is within {MODULE_LIMIT}: take it out of NOT_YET_WITHIN_LIMIT"
    else:
        assert len(loaded) <= MODULE_LIMIT, f"{path.name} loads {len(loaded)} labutils modules (limit {MODULE_LIMIT})"


def test_grading_a_planted_fault_leaves_the_live_readers_unloaded():
    code = ("import sys\nfrom labutils.course.exercises_topology import check_planted_fault\n"
            "print(sorted(m for m in sys.modules if m.startswith('labutils.')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert not {"labutils.doctor.live", "labutils.measure.copies"} & set(loaded), loaded


def test_one_allreduce_time():
    """The all-reduce time formula lives in model.fit.allreduce_ms; no other module defines one."""
    names = {"allreduce_time_ms", "predict_comm_ms", "predict_allreduce_us"}
    for path in sources():
        defined = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
        assert not defined & names, f"{path.name} defines {defined & names}; use labutils.model.fit.allreduce_ms"


def test_the_student_harness_is_short():
    """How busbw is measured reads in one file of under ~150 lines (notebook 02)."""
    assert len((PACKAGE / "measure" / "harness.py").read_text().splitlines()) <= 150


def import_graph() -> dict[str, set[str]]:
    """module -> the labutils modules it imports (only modules of the package, itself left out)."""
    modules = {module_name(p) for p in sources()}
    graph = {}
    for path in sources():
        here, found = module_name(path), set()
        for module, names, _ in imports_of(path):
            found |= {f"{module}.{n}" for n in names if f"{module}.{n}" in modules} or {module}
        graph[here] = found & modules - {here}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_labutils_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


# (module, function) allowed to look at the backend's name: choosing it, and saying what it means
BACKEND_BRANCHES = {("launch", "resolve_backend"), ("launch", "rank_plan"), ("launch", "barrier_kwargs"),
                    ("launch", "group_kwargs"), ("launch", "preflight_for"),
                    ("machine", "route"), ("machine", "label"), ("machine", "check_backend_guess"),
                    ("fit", "fit_alpha_beta"),  # an nccl-tests log without a device column is on CUDA
                    ("rules", "measurement_causes")}  # a measurement taken with gloo is a cause of low busbw


def _backend_comparisons(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def names_backend(n) -> bool:
        if isinstance(n, ast.Constant):
            return n.value in ("nccl", "gloo")
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            return any(names_backend(e) for e in n.elts)
        return "backend" in (getattr(n, "id", "") or getattr(n, "attr", ""))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(names_backend(p) for p in [node.left, *node.comparators]):
            f = node
            while f in parents and not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                f = parents[f]
            yield path.stem, getattr(f, "name", "<module>")


def test_worker_code_never_branches_on_the_backend():
    """Every rank runs the same code on gloo and NCCL: only the launcher's choice and rank plan (and
    the words that describe a route) compare backend names."""
    import labutils

    found = {hit for path in Path(labutils.__file__).parent.rglob("*.py") for hit in _backend_comparisons(path)}
    assert found - BACKEND_BRANCHES == set()
    assert ("launch", "rank_plan") in found  # the scan does see comparisons
