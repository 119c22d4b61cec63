"""Every notebook follows the course's shape: goals first, the case announced, key figures recorded,
exercises at the end checked by a labutils function."""

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def nb(request):
    return nbformat.read(request.param, as_version=4)


def test_opens_with_a_title_and_learning_goals(nb):
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    assert "learn" in first.source.lower()


def test_announces_its_case_before_measuring(nb):
    code = [c.source for c in nb.cells if c.cell_type == "code" and "lab-setup" not in c.metadata.get("tags", [])]
    assert any("announce(" in src for src in code[:3]), "the case (CPU / one GPU / several) is said up front"


def test_records_key_figures_for_the_instructor(nb):
    assert any("record_figure(" in c.source for c in nb.cells if c.cell_type == "code")


def test_figures_are_recorded_in_the_last_code_cell_only(nb):
    """Teaching cells do not call record_figure: the figures for the instructor's index and summary
    are gathered in the notebook's last code cell, under its own heading."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    calls = [i for i in code if "record_figure(" in nb.cells[i].source]
    assert calls == [code[-1]], f"record_figure in cells {calls}; only the last code cell ({code[-1]}) may call it"
    heading = nb.cells[code[-1] - 1]
    assert heading.cell_type == "markdown" and heading.source.startswith("## Figures for the instructor's index")


def test_ends_with_exercises_checked_by_labutils(nb):
    heads = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "markdown" and re.search(r"^#+ .*exercise", c.source, re.I | re.M)]
    assert heads, "an 'Exercises' section"
    after = nb.cells[heads[-1]:]
    calls = re.findall(r"\b(check_\w+)\(", "\n".join(c.source for c in after if c.cell_type == "code"))
    assert calls, "the exercises are checked by a function"
    import labutils  # noqa: F401 - the checkers live in the package, not in the notebook
    defined_in_notebook = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for name in calls:
        assert f"def {name}(" not in defined_in_notebook, f"{name} must live in labutils"
