# @title Setup: make the lab's package importable { display-mode: "form" }
# Nothing to do where `labutils` is installed (`make lab`, `make run`). On Colab it clones the lab and
# pip-installs it beside Colab's own torch; in another Jupyter it uses the clone around this notebook,
# or says how to install it. Its source: tools/first_cell.py (`python tools/nb.py first-cell ...`).
import importlib.util, os, shlex, subprocess, sys
from pathlib import Path

LAB_REPO = "OWNER/REPO"  # the lab on GitHub; instructors put theirs here and in README's Colab links
LAB_REPO_URL = os.environ.get("LAB_REPO_URL", f"https://github.com/{LAB_REPO}.git")
LAB_NEEDS = ("numpy", "pandas", "matplotlib", "ipywidgets")  # what the notebooks import besides torch


class LabNotInstalled(Exception):
    def _render_traceback_(self):  # Jupyter shows this one sentence, not a traceback
        return [str(self)]


def _on_colab():
    if "COLAB_RELEASE_TAG" in os.environ or "COLAB_GPU" in os.environ:
        return True
    try:
        import google.colab  # noqa: F401
        return True
    except ImportError:
        return False


def _run(*command):
    print("$", shlex.join(command))
    subprocess.run(command, check=True)


def _colab_install(clone):
    """Clone the lab and pip-install it with its dependencies: torch is not one, so Colab's stays."""
    if "OWNER/REPO" in LAB_REPO_URL:
        raise LabNotInstalled("Put the lab's GitHub owner/name (from this notebook's Colab address) in LAB_REPO "
                              "above, then run this cell again.")
    if not (clone / "labutils").is_dir():
        _run("git", "clone", "--depth", "1", LAB_REPO_URL, str(clone))
    _run(sys.executable, "-m", "pip", "install", "-q", "-e", str(clone))
    sys.path.insert(0, str(clone))
    importlib.invalidate_caches()
    print(f"Colab: the lab is cloned into {clone} and installed with pip; Colab's torch is kept.")
    return clone


def _clone_around_here():
    """The clone whose notebooks/ folder the kernel runs in, put on sys.path; None if there is none."""
    for root in (Path.cwd().parent, Path.cwd()):
        if (root / "labutils" / "__init__.py").is_file():
            sys.path.insert(0, str(root))
            return root
    return None


def _lab_setup():
    spec = importlib.util.find_spec("labutils")
    if _on_colab():
        root = Path(spec.origin).parent.parent if spec else _colab_install(Path.cwd() / "interconnect-lab")
        if (root / "notebooks").is_dir() and Path.cwd() != root / "notebooks":
            os.chdir(root / "notebooks")  # where the notebooks' relative paths start, as in the lab
            print(f"Colab: working in {Path.cwd()}.")
        try:
            from google.colab import output
            output.enable_custom_widget_manager()  # the sliders are ipywidgets 8
        except (ImportError, AttributeError):
            pass
        return
    if spec is not None:
        return
    root, missing = _clone_around_here(), [m for m in LAB_NEEDS if importlib.util.find_spec(m) is None]
    if root and not missing:
        return print(f"Using the lab in {root} (added to sys.path).")
    where = shlex.quote(str(root)) if root else "/path/to/your/clone"
    why = f"missing: {', '.join(missing)}" if root else f"no clone around it; first git clone {LAB_REPO_URL}"
    raise LabNotInstalled(
        f"The lab is not installed in this kernel ({why}): run `%pip install -e {where}` in a cell (or"
        f" `{shlex.quote(sys.executable)} -m pip install -e {where}` in a terminal), which adds its"
        " dependencies and keeps this kernel's torch, then restart the kernel.")


_lab_setup()
