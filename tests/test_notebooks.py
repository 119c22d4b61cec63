"""Every notebook in notebooks/: committed clean, and executed top to bottom in quick mode."""

import ast
import json
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ALLOWED_NB_METADATA = {"kernelspec", "language_info"}
QUICK_TEST_BUDGET_S = 3  # seconds of measuring per notebook in the suite (the parameter is checked, not the figures)


def _ids(paths):
    return [p.stem for p in paths]


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_clean(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert set(nb.get("metadata", {})) <= ALLOWED_NB_METADATA, f"{path.name}: extra notebook metadata"
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path.name} cell {i} has outputs"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"
        assert set(cell.get("metadata", {})) <= {"tags"}, f"{path.name} cell {i} has extra metadata"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_parameters_cell_is_literals_with_quick(path):
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
    tree = ast.parse(tagged[0].source)
    names = set()
    for node in tree.body:
        assert isinstance(node, (ast.Assign, ast.AnnAssign)), f"{path.name}: parameters cell holds only assignments"
        value = node.value
        ast.literal_eval(value)  # raises if a parameter is computed rather than a literal
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names.update(t.id for t in targets)
    assert "quick" in names, f"{path.name}: the parameters cell must define `quick`"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_executes_in_quick_mode(path, tmp_path, results_tmp, monkeypatch):
    from labutils.course.runner import execute_notebook, notebook_parameters

    rank_log = tmp_path / "ranks.log"  # the kernel's rank pool writes a line per rank process it starts
    monkeypatch.setenv("LAB_RANK_LOG", str(rank_log))
    parameters = {"quick": True}
    if "budget_s" in notebook_parameters(path):  # a measuring notebook: a short budget keeps the suite short
        parameters["budget_s"] = QUICK_TEST_BUDGET_S
    outcome = execute_notebook(path, tmp_path, parameters=parameters, results_dir=results_tmp)
    assert outcome.ok, f"{path.name} failed in cell {outcome.failed_cell}: {outcome.error}"
    assert outcome.html_path.exists()
    started = rank_log.read_text().splitlines() if rank_log.exists() else []
    ranks = max((int(line.split()[4]) for line in started), default=0)  # "<pid> rank <r> of <n> ..."
    assert len(started) <= 2 * ranks, f"{path.name}: the kernel started {len(started)} rank processes " \
                                      f"for {ranks} ranks (at most {2 * ranks}, restarts included)"
