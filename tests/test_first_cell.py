"""The setup cell that opens every notebook (tools/first_cell.py) and the command that writes it;
tools/nb.py's percent-format round trip (jupytext) and clean notebooks.

Its branches run here with the world faked: Colab (its environment variable or a `google.colab`
module) with the clone made from a local repository and pip recorded, not run; a Jupyter whose
kernel lacks the lab, with or without a clone around the notebook; and the lab's own kernel.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIRST_CELL = ROOT / "tools" / "first_cell.py"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
COLAB_VARS = ("COLAB_RELEASE_TAG", "COLAB_GPU")
REAL_RUN = subprocess.run


def _nb_tool():
    spec = importlib.util.spec_from_file_location("lab_nb_tool", ROOT / "tools" / "nb.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _first_code_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_opens_with_the_setup_cell(path):
    cell = _first_code_cell(nbformat.read(path, as_version=4))
    assert cell.source == FIRST_CELL.read_text(encoding="utf-8").strip("\n"), (
        f"{path.name}: run `python tools/nb.py first-cell notebooks/*.ipynb`")
    assert cell.metadata.get("tags") == ["lab-setup"]


def test_the_command_inserts_moves_and_then_changes_nothing(tmp_path):
    tool = _nb_tool()
    path = tmp_path / "nb.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Title"),
                                         nbformat.v4.new_code_cell("quick = False", metadata={"tags": ["parameters"]}),
                                         nbformat.v4.new_code_cell("print(1)")])
    nbformat.write(nb, path)
    assert tool.first_cell(path) is True
    once = path.read_text()
    assert tool.first_cell(path) is False and path.read_text() == once
    cells = nbformat.read(path, as_version=4).cells
    assert [c.cell_type for c in cells] == ["markdown", "code", "code", "code"]
    assert cells[1].metadata["tags"] == ["lab-setup"] and cells[2].metadata["tags"] == ["parameters"]
    # a setup cell that slipped below another code cell (e.g. after a merge) moves back, once
    cells.insert(3, cells.pop(1))
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    assert tool.first_cell(path) is True
    cells = nbformat.read(path, as_version=4).cells
    assert [c.metadata.get("tags") for c in cells if c.cell_type == "code"] == [["lab-setup"], ["parameters"], None]


def test_what_the_cell_checks_is_what_the_lab_depends_on_and_never_torch():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in deps}
    assert not any(name.startswith("torch") for name in names), "pip install -e would replace a kernel's torch"
    needs = _cell_constants()["LAB_NEEDS"]
    assert set(needs) <= names


def _cell_constants() -> dict:
    """The cell's constants, read without running it."""
    import ast

    tree = ast.parse(FIRST_CELL.read_text(encoding="utf-8"))
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.Tuple))}


def test_readme_opens_every_notebook_in_colab_from_the_cells_repository():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"https://colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/main/notebooks/"
                       r"([\w.-]+\.ipynb)", readme)
    assert sorted(name for _, name in links) == [p.name for p in NOTEBOOKS]
    assert {repo for repo, _ in links} == {_cell_constants()["LAB_REPO"]}


# --- running the cell with the world faked ---

def _run_cell() -> dict:
    namespace = {"__name__": "__main__"}
    exec(compile(FIRST_CELL.read_text(encoding="utf-8"), str(FIRST_CELL), "exec"), namespace)
    return namespace


@pytest.fixture
def no_lab(monkeypatch):
    """A kernel where labutils cannot be imported, not on Colab; sys.path restored afterwards."""
    monkeypatch.setitem(sys.modules, "labutils", None)  # find_spec and import now say "not there"
    monkeypatch.setitem(sys.modules, "google.colab", None)
    for name in COLAB_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def recorded(monkeypatch):
    """subprocess.run runs git for real and records everything; pip is recorded, not run."""
    calls = []

    def run(command, *args, **kwargs):
        calls.append([str(part) for part in command])
        if command[0] == "git":
            return REAL_RUN(command, *args, **{"capture_output": True, **kwargs})
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", run)
    return calls


@pytest.fixture
def origin(tmp_path):
    """A local git repository shaped like the lab, to clone instead of GitHub."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "origin"
    (repo / "labutils").mkdir(parents=True)
    (repo / "labutils" / "__init__.py").write_text("")
    (repo / "notebooks").mkdir()
    (repo / "notebooks" / "00_x.ipynb").write_text(json.dumps({}))
    git = ["git", "-C", str(repo), "-c", "user.name=lab", "-c", "user.email=lab@example.org"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "lab"]):
        REAL_RUN(git + command, check=True, capture_output=True)
    return repo


@pytest.mark.parametrize("colab_sign", ["environment", "module"])
def test_on_colab_it_clones_installs_without_torch_and_moves_into_notebooks(
        colab_sign, no_lab, recorded, origin, tmp_path, monkeypatch, capsys):
    widget_manager = []
    if colab_sign == "environment":
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    else:
        output = types.SimpleNamespace(enable_custom_widget_manager=lambda: widget_manager.append(True))
        colab = types.ModuleType("google.colab")
        colab.output = output
        google = types.ModuleType("google")
        google.colab = colab
        monkeypatch.setitem(sys.modules, "google", google)
        monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setenv("LAB_REPO_URL", origin.as_uri())
    content = tmp_path / "content"
    content.mkdir()
    monkeypatch.chdir(content)

    _run_cell()
    clone = content / "interconnect-lab"
    assert recorded == [["git", "clone", "--depth", "1", origin.as_uri(), str(clone)],
                        [sys.executable, "-m", "pip", "install", "-q", "-e", str(clone)]]
    assert (clone / "labutils" / "__init__.py").is_file()
    assert not any("torch" in part.lower() for call in recorded for part in call)
    assert sys.path[0] == str(clone) and Path.cwd() == clone / "notebooks"
    out = capsys.readouterr().out
    assert f"$ git clone --depth 1 {origin.as_uri()} {clone}" in out
    assert "pip install -q -e" in out and "Colab's torch is kept" in out and f"working in {clone}" in out
    assert widget_manager == ([True] if colab_sign == "module" else [])

    monkeypatch.chdir(content)  # run again (e.g. after a restart): no second clone
    recorded.clear()
    _run_cell()
    assert [call[:2] for call in recorded] == [[sys.executable, "-m"]]
    assert Path.cwd() == clone / "notebooks"


def test_on_colab_without_a_repository_address_it_says_where_to_put_it(no_lab, recorded, tmp_path, monkeypatch):
    monkeypatch.setenv("COLAB_GPU", "1")
    monkeypatch.delenv("LAB_REPO_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="owner/name .* in LAB_REPO above") as stop:
        _run_cell()
    assert type(stop.value).__name__ == "LabNotInstalled" and recorded == []


def test_without_the_lab_and_without_a_clone_it_stops_with_the_command(no_lab, recorded, tmp_path,
                                                                      monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception) as stop:
        _run_cell()
    sentence = str(stop.value)
    assert type(stop.value).__name__ == "LabNotInstalled"
    assert stop.value._render_traceback_() == [sentence], "Jupyter shows the sentence alone"
    assert "\n" not in sentence and sentence.count(". ") == 0 and sentence.endswith(".")
    assert "git clone https://github.com/" in sentence
    assert "`%pip install -e /path/to/your/clone`" in sentence
    assert f"{sys.executable} -m pip install -e /path/to/your/clone" in sentence
    assert "keeps this kernel's torch" in sentence
    assert recorded == [] and capsys.readouterr().out == ""


def test_without_the_lab_it_uses_the_clone_the_notebook_sits_in(no_lab, recorded, tmp_path, monkeypatch, capsys):
    (tmp_path / "labutils").mkdir()
    (tmp_path / "labutils" / "__init__.py").write_text("")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    _run_cell()
    assert sys.path[0] == str(tmp_path)
    assert capsys.readouterr().out.strip() == f"Using the lab in {tmp_path} (added to sys.path)."
    assert recorded == [] and Path.cwd() == tmp_path / "notebooks"

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # the clone is there, a dependency is not
    with pytest.raises(Exception) as stop:
        _run_cell()
    sentence = str(stop.value)
    assert "missing: ipywidgets" in sentence and f"`%pip install -e {tmp_path}`" in sentence
    assert "git clone" not in sentence


def test_where_the_lab_is_installed_it_does_nothing(monkeypatch, recorded, capsys, tmp_path):
    for name in COLAB_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "google.colab", None)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)
    _run_cell()
    assert capsys.readouterr().out == "" and recorded == []
    assert sys.path == path_before and Path.cwd() == tmp_path


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_export_then_build_gives_the_same_cells(path, tmp_path):
    """tools/nb.py export then build (jupytext's percent format) loses nothing: same cells, same
    sources, same tags; the notebook it writes is clean (only kernelspec/language_info, tags)."""
    tool = _nb_tool()
    script, built = tmp_path / "nb.py", tmp_path / "nb.ipynb"
    tool.export(path, script)
    assert script.read_text(encoding="utf-8").startswith("# %%")  # no header: cells and tags only
    tool.build(script, built)
    cells = lambda nb: [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]  # noqa: E731
    before, after = nbformat.read(path, as_version=4), nbformat.read(built, as_version=4)
    assert cells(after) == cells(before)
    assert set(after.metadata) == {"kernelspec", "language_info"}
    assert all(set(c.metadata) <= {"tags"} for c in after.cells)


def test_build_reads_a_hand_written_script(tmp_path):
    tool = _nb_tool()
    script, built = tmp_path / "x.py", tmp_path / "x.ipynb"
    script.write_text('# %% [markdown]\n# # Title\n#\n# Text.\n\n# %% tags=["parameters"]\nquick = False\n\n'
                      '# %%\nprint(quick)\n', encoding="utf-8")
    tool.build(script, built)
    nb = nbformat.read(built, as_version=4)
    assert [(c.cell_type, c.source) for c in nb.cells] == [("markdown", "# Title\n\nText."),
                                                          ("code", "quick = False"), ("code", "print(quick)")]
    assert nb.cells[1].metadata == {"tags": ["parameters"]} and [c.id for c in nb.cells] == ["cell-00", "cell-01",
                                                                                         "cell-02"]
    assert all(c.outputs == [] for c in nb.cells if c.cell_type == "code")
