# @title Setup: make the lab's package importable { display-mode: "form" }
import contextlib, importlib.util, os, subprocess, sys  # nothing to do under `make lab`; source: tools/first_cell.py
LAB_REPO = "OWNER/REPO"  # the lab on GitHub; instructors put theirs here and in README's Colab links
url = os.environ.get("LAB_REPO_URL", f"https://github.com/{LAB_REPO}.git")
lab = os.path.abspath(next((p for p in ("..", ".") if os.path.isdir(f"{p}/labutils")), "interconnect-lab"))  # the clone
colab = bool({"COLAB_RELEASE_TAG", "COLAB_GPU"} & set(os.environ)) or sys.modules.get("google.colab") is not None
if colab and (os.path.isdir(lab) or "OWNER/REPO" not in url):  # clone, pip-install (not torch: Colab's stays)
    subprocess.check_call(["bash", "-exc", f"[ -d {lab} ] || git clone --depth 1 {url} {lab}; pip install -q -e {lab}"])
    os.chdir(f"{lab}/notebooks")
    with contextlib.suppress(ImportError): from google.colab import output; output.enable_custom_widget_manager()
importlib.util.find_spec("labutils") or sys.path.insert(0, lab)  # not installed in this kernel: use the clone
if missing := [m for m in "labutils numpy pandas matplotlib ipywidgets".split() if not importlib.util.find_spec(m)]:
    raise type("LabNotInstalled", (Exception,), {"_render_traceback_": lambda self: [str(self)]})(
        f"This kernel lacks {', '.join(missing)}: run `%pip install -e {lab}` in a cell (it keeps this kernel's torch)"
        f"{'' if os.path.isdir(lab) else f' after `git clone {url} {lab}` (LAB_REPO above)'}, then restart the kernel.")
