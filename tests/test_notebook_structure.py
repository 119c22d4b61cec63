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


# A notebook is read in 20 to 30 minutes with its exercises: at most this much prose and code.
MAX_PROSE_WORDS = 1400
MAX_CODE_LINES = 110


def reading_load(nb) -> tuple[int, int]:
    """(words of prose, lines of code) outside the setup cell: words are the whitespace-separated
    tokens of the markdown cells; lines of code are the non-blank lines of the code cells that are not
    comments alone."""
    words = sum(len(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    lines = sum(1 for c in nb.cells if c.cell_type == "code" and "lab-setup" not in c.metadata.get("tags", [])
                for line in c.source.splitlines() if line.strip() and not line.strip().startswith("#"))
    return words, lines


def test_reading_load_counts_words_and_code_lines():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Title\n\nTwo words."),
        nbformat.v4.new_code_cell("import os\nimport sys", metadata={"tags": ["lab-setup"]}),
        nbformat.v4.new_code_cell("# a comment\nx = 1\n\n    # indented comment\ny = x  # trailing comment")])
    assert reading_load(nb) == (4, 2)


def test_readable_in_twenty_to_thirty_minutes(nb):
    words, lines = reading_load(nb)
    assert words <= MAX_PROSE_WORDS, f"{words} words of prose (at most {MAX_PROSE_WORDS})"
    assert lines <= MAX_CODE_LINES, f"{lines} lines of code outside the setup cell (at most {MAX_CODE_LINES})"
