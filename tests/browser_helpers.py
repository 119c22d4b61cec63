"""JupyterLab in headless Chromium for the browser tests: a server, a browser, and a few page moves.

The server runs with `make lab`'s command line (127.0.0.1, token on) at a free port, with temporary
settings, workspace, runtime and data directories, and the notebooks of a temporary folder as its
root. The browser is Debian's `chromium` driven by Playwright (never a downloaded one) with a
fresh profile. Both are stopped by their context managers, together with every process they
started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from labutils.course.lab import LabNotStarted, lab_command, wait_for_lab


def stop_lab(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Stop a server started with start_new_session=True, and everything it started.

    SIGTERM to its process group lets the server shut its kernels down; what is still there after
    `timeout_s` is killed. Kernels run in sessions of their own, so they are collected first and
    ended one by one as well.
    """
    try:
        started = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        started = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout_s)
    _, alive = psutil.wait_procs(started, timeout=timeout_s)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(alive, timeout=timeout_s)


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
SERVER_START_S = 60.0

# Settings written into the temporary JupyterLab settings directory: no news or update checks,
# no autosave, no kernel-choice dialog, and every cell kept in the page so the tests can read
# all of them.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
        {"windowingMode": "none", "autoStartDefaultKernel": True},
}


def why_no_browser() -> str | None:
    """A plain reason the browser tests cannot run here, or None when they can."""
    if not CHROMIUM.exists():
        return (f"{CHROMIUM} is missing: install Debian's chromium "
                "(`apt-get install chromium`; .ci/run does this when apt-get is available)")
    try:
        version = subprocess.run([str(CHROMIUM), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{CHROMIUM} does not start: {err}"
    if version.returncode != 0 or "chrom" not in version.stdout.lower():
        # e.g. Ubuntu's /usr/bin/chromium, a stub that needs snapd
        detail = " ".join((version.stderr or version.stdout).split())[-300:]
        return f"{CHROMIUM} does not start: {detail}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is missing (`pip install -e '.[test]'`)"
    try:
        import jupyterlab  # noqa: F401
        import jupyterlab_widgets  # noqa: F401
    except ImportError as err:
        return f"JupyterLab or its widget extension is missing ({err.name})"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class LabServer:
    """A running JupyterLab: where it listens and the token it wants."""

    url: str
    token: str
    root_dir: Path
    runtime_dir: Path
    process: subprocess.Popen

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}&reset"


def _write_settings(settings_dir: Path) -> None:
    for rel, values in LAB_SETTINGS.items():
        path = settings_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values), encoding="utf-8")


@contextlib.contextmanager
def jupyter_lab(root_dir: Path, work_dir: Path, extra_env: dict | None = None):
    """Start JupyterLab on `root_dir` as `make lab` does, yield a LabServer once it answers, always
    stop it with every process it started (labutils.course.lab: the command, the wait, the stop).

    `extra_env` is added to the server's environment, which its kernels inherit (a None value
    removes that variable).
    """
    dirs = {name: work_dir / name for name in ("settings", "workspaces", "runtime", "data", "config")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    _write_settings(dirs["settings"])
    env = dict(os.environ,
               JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]),
               JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
               JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
               JUPYTER_DATA_DIR=str(dirs["data"]),
               JUPYTER_CONFIG_DIR=str(dirs["config"]),
               PYTHONUNBUFFERED="1", **(extra_env or {}))
    env = {key: value for key, value in env.items() if value is not None}  # None: leave it out
    # `make lab`'s own command line, plus no update checks
    command = lab_command(sys.executable, root_dir, uid=os.geteuid(), port=free_port()) + [
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = work_dir / "jupyterlab.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(command, cwd=root_dir, env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            info = wait_for_lab(process, dirs["runtime"], SERVER_START_S)
        except LabNotStarted as err:
            raise RuntimeError(f"{err}:\n{log.read_text()[-3000:]}") from None
        yield LabServer(url=info.root_url().rstrip("/"), token=info.token, root_dir=root_dir,
                        runtime_dir=dirs["runtime"], process=process)
    finally:
        stop_lab(process)


@contextlib.contextmanager
def chromium(profile_dir: Path, width: int = 1400, height: int = 1000):
    """A Playwright browser context in Debian's headless chromium with a fresh profile; always closed.

    HOME points into a temporary folder too, so chromium's crash handler (which outlives the
    browser for a moment) keeps its files there and can be told apart from anyone else's.
    """
    from playwright.sync_api import sync_playwright

    home = profile_dir.with_name(profile_dir.name + "-home")
    for path in (profile_dir, home):
        path.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                str(profile_dir), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
                env=dict(os.environ, HOME=str(home)), viewport={"width": width, "height": height})
            context.set_default_timeout(30_000)
            try:
                yield context
            finally:
                context.close()
    finally:
        _end_processes_mentioning(str(profile_dir), str(home))


def _end_processes_mentioning(*markers: str) -> None:
    """End what is left of the browser: processes whose command line names our own folders."""
    def ours(proc) -> bool:
        try:
            line = " ".join(proc.cmdline())
        except (psutil.Error, OSError):
            return False
        return any(marker in line for marker in markers)

    _, alive = psutil.wait_procs([p for p in psutil.process_iter() if ours(p)], timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


# --- page moves in JupyterLab -------------------------------------------------------------------

def open_notebook(page, server: LabServer, name: str) -> None:
    """Open notebook `name` and wait until its kernel is idle."""
    page.goto(server.notebook_url(name))
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
    wait_kernel_idle(page)


def wait_kernel_idle(page, timeout_ms: int = 60_000) -> None:
    """Wait until the status bar names a kernel that is connected and idle.

    The notebook toolbar reads "idle" before any kernel is attached, so the status bar's
    "Python 3 (ipykernel) | Idle" is the signal that cells can run.
    """
    page.wait_for_function(
        """() => {
            const item = document.querySelector('.jp-StatusBar-TextItem[title^="Change kernel"]');
            const text = item ? item.textContent.trim() : '';
            const busy = document.querySelector('.jp-Notebook-ExecutionIndicator');
            return !text.startsWith('No Kernel') && /\\|\\s*Idle$/.test(text)
                && busy && busy.getAttribute('data-status') === 'idle';
        }""", timeout=timeout_ms)


def run_all_cells(page, timeout_ms: int = 90_000) -> None:
    """Run > Run All Cells, then wait until every code cell ran or one failed (which stops the run)."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
            const texts = prompts.map(p => p.textContent);
            const failed = [...document.querySelectorAll('.jp-OutputArea-output')]
                .some(o => o.textContent.includes('Traceback'));
            return prompts.length > 0 && !texts.some(t => t.includes('*'))
                && (failed || texts.every(t => /\\[\\d+\\]/.test(t)));
        }""", timeout=timeout_ms)
    wait_kernel_idle(page, timeout_ms)


def cell_errors(page) -> list[str]:
    """The text of every output that holds a traceback (a cell that failed)."""
    return page.locator(".jp-OutputArea-output").filter(has_text="Traceback").all_inner_texts()


def slider(page, description: str):
    """The ipywidgets slider whose description contains `description`."""
    return page.locator(".widget-slider", has=page.locator(".widget-label", has_text=description)).first


def type_into_readout(page, widget, value) -> None:
    """Type `value` into a slider's readout and press Enter (ipywidgets 8 readouts are editable)."""
    widget.locator(".widget-readout").click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")


def press_on_handle(widget, key: str, times: int = 1) -> None:
    """Focus a slider's handle and press `key` (e.g. ArrowRight) `times` times."""
    handle = widget.locator(".noUi-handle")
    handle.focus()
    for _ in range(times):
        handle.press(key)


def readout_text(widget) -> str:
    return widget.locator(".widget-readout").inner_text().strip()


def image_sha256(page, selector: str) -> str:
    """sha256 of the bytes an <img> shows (ipywidgets' Image holds them in a blob: URL)."""
    return page.evaluate(
        """async (selector) => {
            const img = document.querySelector(selector);
            const bytes = await (await fetch(img.src)).arrayBuffer();
            const digest = await crypto.subtle.digest('SHA-256', bytes);
            return [...new Uint8Array(digest)].map(b => b.toString(16).padStart(2, '0')).join('');
        }""", selector)


# --- the kernel behind a notebook -----------------------------------------------------------------

def kernel_eval(server: LabServer, notebook: str, expression: str, timeout_s: float = 30.0):
    """Evaluate `expression` silently in the kernel of `notebook`; returns its value (a literal).

    A second client on the kernel's connection file: nothing appears in the notebook and the
    execution count does not move. The expression must evaluate to a Python literal.
    """
    import ast

    from jupyter_client import BlockingKernelClient

    with urllib.request.urlopen(f"{server.url}/api/sessions?token={server.token}", timeout=5) as reply:
        sessions = json.load(reply)
    kernel_id = next(s["kernel"]["id"] for s in sessions if s["path"].endswith(notebook))
    client = BlockingKernelClient()
    client.load_connection_file(str(server.runtime_dir / f"kernel-{kernel_id}.json"))
    client.start_channels()
    try:
        client.wait_for_ready(timeout=timeout_s)
        msg_id = client.execute("", silent=True, user_expressions={"value": expression})
        while True:
            reply = client.get_shell_msg(timeout=timeout_s)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
    finally:
        client.stop_channels()
    result = reply["content"]["user_expressions"]["value"]
    if result["status"] != "ok":
        raise RuntimeError(f"{result.get('ename')}: {result.get('evalue')} in {expression!r}")
    return ast.literal_eval(result["data"]["text/plain"])
