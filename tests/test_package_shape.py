"""The shape of labutils: no import cycles, pure model modules, one all-reduce time, sizes."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "labutils"
# The model modules: importable without torch.distributed or a launcher (no processes, no files).
PURE = ("labutils.busbw", "labutils.fit", "labutils.budget", "labutils.ddp_model", "labutils.hardware_ratio")


def _labutils_imports(path: Path) -> set[str]:
    """Every labutils module `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("labutils.")}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "labutils":
                found |= {a.name for a in node.names}
            elif node.module.startswith("labutils."):
                found.add(node.module.split(".")[1])
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {p.stem: _labutils_imports(p) & modules - {p.stem} for p in PACKAGE.glob("*.py")}


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
    assert find_cycle(import_graph()) is None, f"import cycle: {' -> '.join(find_cycle(import_graph()))}"


def test_every_module_imports():
    code = "import importlib, pkgutil, labutils\n" \
           "for m in pkgutil.iter_modules(labutils.__path__):\n    importlib.import_module('labutils.' + m.name)\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch.distributed" or name.startswith("torch.distributed.") or name in ("labutils.launch",
                "labutils.sweep", "labutils.results", "labutils.my_link"):
            raise ImportError(f"{name} is blocked: a model module must not need it")
sys.meta_path.insert(0, Block())
import labutils.busbw, labutils.fit
"""


@pytest.mark.parametrize("module", PURE)
def test_model_modules_import_without_torch_distributed_launcher_or_files(module):
    code = BLOCKER + f"import {module}\n" + f"assert 'torch.distributed' not in sys.modules, '{module}'\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert done.returncode == 0, done.stderr[-2000:]


def test_one_allreduce_time():
    """The all-reduce time formula lives in fit.allreduce_ms; no other module defines one."""
    names = {"allreduce_time_ms", "predict_comm_ms", "predict_allreduce_us"}
    for path in PACKAGE.glob("*.py"):
        defined = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
        assert not defined & names, f"{path.name} defines {defined & names}; use labutils.fit.allreduce_ms"


def test_the_student_harness_is_short():
    """How busbw is measured reads in one file of under ~150 lines (notebook 02)."""
    assert len((PACKAGE / "harness.py").read_text().splitlines()) <= 150


def test_no_module_is_over_about_450_lines():
    """One concept per module, readable in one sitting: none over 460 lines."""
    sizes = {path.name: len(path.read_text().splitlines()) for path in PACKAGE.glob("*.py")}
    over = {name for name, n in sizes.items() if n > 460}
    assert not over, f"over 460 lines: {sorted(over)}; split along a seam"
