"""Author and clean the lab's notebooks.

    python tools/nb.py build SRC.py notebooks/NN_name.ipynb   # percent-format script -> clean notebook
    python tools/nb.py export notebooks/NN_name.ipynb SRC.py  # notebook -> percent-format script, to edit
    python tools/nb.py clean notebooks/*.ipynb                 # strip outputs, counts, extra metadata
    python tools/nb.py first-cell notebooks/*.ipynb            # (re)write the setup cell from tools/first_cell.py

Percent format: `# %% [markdown]` starts a markdown cell (each line prefixed with "# "),
`# %%` a code cell, and `# %% tags=["parameters"]` the papermill parameters cell.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import nbformat

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
FIRST_CELL = Path(__file__).resolve().with_name("first_cell.py")  # the setup cell's one source
SETUP_TAG = "lab-setup"


def _finish(cells, kind, tags, lines):
    text = "\n".join(lines).strip("\n")
    if not text:
        return
    if kind == "markdown":
        text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in text.splitlines())
        cell = nbformat.v4.new_markdown_cell(text)
    else:
        cell = nbformat.v4.new_code_cell(text)
    if tags:
        cell.metadata["tags"] = tags
    cells.append(cell)


def build(src: Path, dst: Path) -> None:
    cells, kind, tags, lines = [], None, [], []
    for line in Path(src).read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            if kind:
                _finish(cells, kind, tags, lines)
            rest = line[4:].strip()
            kind = "markdown" if rest.startswith("[markdown]") else "code"
            tags = ast.literal_eval(rest.split("=", 1)[1]) if rest.startswith("tags=") else []
            lines = []
        else:
            lines.append(line)
    if kind:
        _finish(cells, kind, tags, lines)
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC,
                                                         "language_info": {"name": "python"}})
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    nbformat.validate(nb)
    nbformat.write(nb, dst)


def export(src: Path, dst: Path) -> None:
    nb = nbformat.read(src, as_version=4)
    parts = []
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "markdown":
            body = "\n".join(("# " + line) if line else "#" for line in cell.source.splitlines())
            parts.append("# %% [markdown]\n" + body)
        else:
            parts.append(("# %% tags=" + json.dumps(tags) if tags else "# %%") + "\n" + cell.source)
    Path(dst).write_text("\n\n".join(parts) + "\n", encoding="utf-8")


def clean(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k == "tags"}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, path)


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
