"""Author and clean the lab's notebooks.

    python tools/nb.py build SRC.py notebooks/NN_name.ipynb   # percent-format script -> clean notebook
    python tools/nb.py export notebooks/NN_name.ipynb SRC.py  # notebook -> percent-format script, to edit
    python tools/nb.py clean notebooks/*.ipynb                 # strip outputs, counts, extra metadata
    python tools/nb.py first-cell notebooks/*.ipynb            # (re)write the setup cell from tools/first_cell.py

build and export are jupytext's percent format (`jupytext --to py:percent` reads and writes the same
files): `# %% [markdown]` starts a markdown cell (each line prefixed with "# "), `# %%` a code cell,
and `# %% tags=["parameters"]` the papermill parameters cell. What this file adds is the clean
notebook the tests want (`clean_notebook`): only kernelspec and language_info as notebook metadata,
only `tags` as cell metadata, no outputs, cell ids cell-00, cell-01, ... in order.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import nbformat

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
FIRST_CELL = Path(__file__).resolve().with_name("first_cell.py")  # the setup cell's one source
SETUP_TAG = "lab-setup"
FORMAT = "py:percent"
# The script holds the cells and their tags only: no YAML header, no other metadata.
SCRIPT_FILTERS = {"notebook_metadata_filter": "-all", "cell_metadata_filter": "tags,-all"}


def clean_notebook(nb, renumber: bool = False):
    """The notebook as it is committed: kernelspec and language_info only, `tags` the only cell
    metadata, no outputs or execution counts; with `renumber`, cell ids cell-00, cell-01, ..."""
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    for i, cell in enumerate(nb.cells):
        cell.metadata = {k: v for k, v in cell.metadata.items() if k == "tags"}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        if renumber:
            cell["id"] = f"cell-{i:02d}"
    return nb


def build(src: Path, dst: Path) -> None:
    nb = clean_notebook(jupytext.read(src, fmt=FORMAT), renumber=True)
    nbformat.validate(nb)
    nbformat.write(nb, dst)


def export(src: Path, dst: Path) -> None:
    nb = nbformat.read(src, as_version=4)
    nb.metadata["jupytext"] = dict(SCRIPT_FILTERS)
    jupytext.write(nb, dst, fmt=FORMAT)


def clean(path: Path) -> None:
    nbformat.write(clean_notebook(nbformat.read(path, as_version=4)), path)


def first_cell(path: Path) -> bool:
    """Make the notebook's first code cell the setup cell of tools/first_cell.py, tagged lab-setup.

    Any earlier setup cell is removed and the current one goes just before the first other code
    cell, so running it again changes nothing. Returns whether the file was rewritten.
    """
    text = FIRST_CELL.read_text(encoding="utf-8").strip("\n")
    nb = nbformat.read(path, as_version=4)
    before = nbformat.writes(nb)
    old = [c for c in nb.cells if SETUP_TAG in c.metadata.get("tags", [])]
    nb.cells = [c for c in nb.cells if SETUP_TAG not in c.metadata.get("tags", [])]
    at = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
    cell = nbformat.v4.new_code_cell(text, metadata={"tags": [SETUP_TAG]})
    cell["id"] = old[0].get("id", SETUP_TAG) if old else SETUP_TAG
    nb.cells.insert(at, cell)
    nbformat.validate(nb)
    if nbformat.writes(nb) == before:
        return False
    nbformat.write(nb, path)
    return True


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:] or ["help"]
    if cmd == "build" and len(rest) == 2:
        build(Path(rest[0]), Path(rest[1]))
    elif cmd == "export" and len(rest) == 2:
        export(Path(rest[0]), Path(rest[1]))
    elif cmd == "clean" and rest:
        for p in rest:
            clean(Path(p))
    elif cmd == "first-cell" and rest:
        for p in rest:
            print(p, "updated" if first_cell(Path(p)) else "already up to date")
    else:
        sys.exit(__doc__)
