"""The setup cell that opens every notebook (tools/first_cell.py) and the command that writes it;
tools/nb.py's percent-format round trip (jupytext) and clean notebooks.

Its branches run here with the world faked: Colab (its environment variable or a `google.colab`
module) with the clone made from a local repository and pip recorded, not run (its shell script runs,
pip made a no-op); a Jupyter whose
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
REAL_CHECK_CALL = subprocess.check_call


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
    (checked,) = re.findall(r'"(labutils [\w ]+)"\.split\(\)', FIRST_CELL.read_text(encoding="utf-8"))
    assert checked.split()[0] == "labutils" and set(checked.split()[1:]) <= names


def test_the_cell_is_short():
    lines = FIRST_CELL.read_text(encoding="utf-8").strip("\n").splitlines()
    assert len(lines) <= 15 and max(map(len, lines)) <= 120


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
    """A kernel where labutils cannot be found (neither on sys.path nor by the editable install's
    finder), not on Colab; sys.path, sys.meta_path and sys.modules restored afterwards."""
    monkeypatch.delitem(sys.modules, "labutils", raising=False)
    monkeypatch.setitem(sys.modules, "google.colab", None)
    for name in COLAB_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p or ".") / "labutils").is_dir()])
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path
                                           if not (hasattr(f, "find_spec") and f.find_spec("labutils", None))])
    importlib.invalidate_caches()
    assert importlib.util.find_spec("labutils") is None


@pytest.fixture
def recorded(monkeypatch):
    """subprocess.check_call runs the cell's script for real (its git clone too) with pip a no-op,
    and records every command."""
    calls = []

    def check_call(command, *args, **kwargs):
        calls.append([str(part) for part in command])
        assert command[:2] == ["bash", "-exc"], command
        return REAL_CHECK_CALL([*command[:2], command[2].replace("pip install", ": pip install")], *args, **kwargs)

    monkeypatch.setattr(subprocess, "check_call", check_call)
    return calls


@pytest.fixture
def origin(tmp_path):
    """A local git repository shaped like the lab, to clone instead of GitHub."""
    if shutil.which("git") is None or shutil.which("bash") is None:
        pytest.skip("git or bash is not installed")
    repo = tmp_path / "origin"
    (repo / "labutils").mkdir(parents=True)
    (repo / "labutils" / "__init__.py").write_text("")
    (repo / "notebooks").mkdir()
    (repo / "notebooks" / "00_x.ipynb").write_text(json.dumps({}))
    git = ["git", "-C", str(repo), "-c", "user.name=lab", "-c", "user.email=lab@example.org"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "lab"]):
        subprocess.run(git + command, check=True, capture_output=True)
    return repo


@pytest.mark.parametrize("colab_sign", ["environment", "module", "both"])
def test_on_colab_it_clones_installs_without_torch_and_moves_into_notebooks(
        colab_sign, no_lab, recorded, origin, tmp_path, monkeypatch, capfd):
    widget_manager = []
    if colab_sign in ("environment", "both"):  # a real Colab kernel has both signs
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    if colab_sign in ("module", "both"):
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
    ((script,),) = [call[2:] for call in recorded]
    assert f"git clone --depth 1 {origin.as_uri()} {clone}" in script
    assert script.endswith(f"pip install -q -e {clone}") and "torch" not in script.lower()
    assert (clone / "labutils" / "__init__.py").is_file()
    assert sys.path[0] == str(clone) and Path.cwd() == clone / "notebooks"
    assert f"+ git clone --depth 1 {origin.as_uri()} {clone}" in capfd.readouterr().err, "each step is shown"
    assert widget_manager == ([] if colab_sign == "environment" else [True])

    monkeypatch.chdir(content)  # run again (e.g. after a restart): no second clone
    recorded.clear()
    _run_cell()
    assert len(recorded) == 1 and "+ git clone" not in capfd.readouterr().err
    assert Path.cwd() == clone / "notebooks"


def test_on_colab_without_a_repository_address_it_says_where_to_put_it(no_lab, recorded, tmp_path, monkeypatch):
    monkeypatch.setenv("COLAB_GPU", "1")
    monkeypatch.delenv("LAB_REPO_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match=r"git clone https://github\.com/OWNER/REPO\.git .* \(LAB_REPO above\)") as stop:
        _run_cell()
    assert type(stop.value).__name__ == "LabNotInstalled" and recorded == [] and Path.cwd() == tmp_path


def test_without_the_lab_and_without_a_clone_it_stops_with_the_command(no_lab, recorded, tmp_path,
                                                                      monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception) as stop:
        _run_cell()
    sentence = str(stop.value)
    assert type(stop.value).__name__ == "LabNotInstalled"
    assert stop.value._render_traceback_() == [sentence], "Jupyter shows the sentence alone"
    assert "\n" not in sentence and sentence.count(". ") == 0 and sentence.endswith(".")
    assert sentence.startswith("This kernel lacks labutils: ")
    assert f"after `git clone https://github.com/OWNER/REPO.git {tmp_path / 'interconnect-lab'}`" in sentence
    assert f"`%pip install -e {tmp_path / 'interconnect-lab'}`" in sentence
    assert "keeps this kernel's torch" in sentence and "restart the kernel" in sentence
    assert recorded == [] and capsys.readouterr().out == ""


def test_without_the_lab_it_uses_the_clone_the_notebook_sits_in(no_lab, recorded, tmp_path, monkeypatch, capsys):
    (tmp_path / "labutils").mkdir()
    (tmp_path / "labutils" / "__init__.py").write_text("")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    _run_cell()
    assert sys.path[0] == str(tmp_path) and importlib.util.find_spec("labutils").origin == str(
        tmp_path / "labutils" / "__init__.py")
    assert recorded == [] and capsys.readouterr().out == "" and Path.cwd() == tmp_path / "notebooks"

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # the clone is there, a dependency is not
    with pytest.raises(Exception) as stop:
        _run_cell()
    sentence = str(stop.value)
    assert sentence.startswith("This kernel lacks ipywidgets: ") and f"`%pip install -e {tmp_path}`" in sentence
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
