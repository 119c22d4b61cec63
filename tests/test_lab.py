"""`make lab`: the JupyterLab command line (root, address, port), what it prints, and a real start.

The real start runs `python -m labutils lab`, exactly what `make lab` runs, on a free port, checks
that the server JupyterLab runs has `lab_command`'s options, listens on 127.0.0.1 only, refuses
the API without its token and serves it with the token, then stops it with nothing left running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser_helpers import free_port, stop_lab

from labutils.cli import main
from labutils.course import lab
from labutils.course.runner import NOTEBOOK_DIR

ROOT = Path(__file__).resolve().parent.parent
START_S = 90.0


# --- the command line, a pure function of uid, ip and port ---

@pytest.mark.parametrize("uid,root", [(0, True), (1000, False)])
def test_root_alone_adds_allow_root(uid, root):
    command = lab.lab_command("/py", Path("/lab/notebooks"), uid=uid)
    assert command[:5] == ["/py", "-m", "jupyter", "lab", "--no-browser"]
    assert "--ServerApp.ip=127.0.0.1" in command and "--ServerApp.port=8888" in command
    assert "--ServerApp.root_dir=/lab/notebooks" in command
    assert ("--allow-root" in command) is root
    assert not any("token" in arg.lower() or "password" in arg.lower() for arg in command), \
        "the token is left on and never put on a command line"


def test_address_and_port_are_passed_through():
    command = lab.lab_command("/py", Path("/nb"), uid=1000, ip="0.0.0.0", port=8899)
    assert "--ServerApp.ip=0.0.0.0" in command and "--ServerApp.port=8899" in command


def test_notes_say_root_and_warn_on_an_open_address():
    assert lab.start_notes(1000, "127.0.0.1") == []
    (root_note,) = lab.start_notes(0, "127.0.0.1")
    assert "--allow-root" in root_note and "uid 0" in root_note
    (warning,) = lab.start_notes(1000, "0.0.0.0")
    assert "warning" in warning and "token is then the only protection" in warning
    assert len(lab.start_notes(0, "10.1.2.3")) == 2
    assert lab.start_notes(1000, "::1") == []


def test_banner_gives_the_url_with_its_token_and_the_tunnel():
    info = lab.ServerInfo(host="127.0.0.1", port=8900, token="abc123")
    lines = "\n".join(lab.banner(info, "alice", asked_port=8899))
    assert "http://127.0.0.1:8900/lab?token=abc123" in lines
    assert "ssh -N -L 8888:127.0.0.1:8900 alice@HOST" in lines
    assert "http://127.0.0.1:8888/lab?token=abc123" in lines  # the laptop's end
    assert "port 8899 was in use" in lines
    assert "was in use" not in "\n".join(lab.banner(info, "alice", asked_port=8900))


def test_banner_for_every_interface_and_without_a_token():
    info = lab.ServerInfo(host="0.0.0.0", port=8888, token="")
    lines = "\n".join(lab.banner(info, "root", asked_port=8888))
    assert "ssh -N -L 8888:127.0.0.1:8888 root@HOST" in lines
    assert "http://127.0.0.1:8888/lab\n" in lines + "\n" and "no token" in lines
    with_password = "\n".join(lab.banner(lab.ServerInfo("127.0.0.1", 8888, "", password=True), "root", 8888))
    assert "password" in with_password and "anyone" not in with_password
    assert lab.url_host("::1") == "[::1]" and lab.url_host("10.0.0.5") == "10.0.0.5"


def test_server_info_is_read_from_the_runtime_file(tmp_path):
    assert lab.read_server_info(tmp_path, 42) is None
    (tmp_path / "jpserver-42.json").write_text('{"hostname": "127.0.0.1", "port": 8890, "tok')
    assert lab.read_server_info(tmp_path, 42) is None  # half written
    (tmp_path / "jpserver-42.json").write_text(
        '{"hostname": "127.0.0.1", "port": 8890, "token": "t0k", "base_url": "/x/", "secure": false}')
    info = lab.read_server_info(tmp_path, 42)
    assert info == lab.ServerInfo(host="127.0.0.1", port=8890, token="t0k", base_url="/x/")
    assert info.lab_url() == "http://127.0.0.1:8890/x/lab?token=t0k"


@pytest.mark.parametrize("argv,name", [(["--port", "99999"], "--port"), (["--port", "eight"], "--port"),
                                       (["--ip", "everywhere"], "--ip")])
def test_bad_input_is_one_line_and_starts_nothing(argv, name, capsys, monkeypatch):
    def no_start(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(lab.subprocess, "Popen", no_start)
    assert main(["lab", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and name in err


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_lab_takes_port_and_ip_from_its_command_line_only():
    """`make lab PORT=... IP=...` reaches the subcommand; PORT or IP in the environment do not."""
    # Under `make test` this make is a sub-make: without its parent's flags, and no directory lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(PORT="1234", IP="0.0.0.0")

    def recipe(*variables):
        dry = subprocess.run(["make", "--no-print-directory", "-n", "lab", *variables], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True)
        return dry.stdout.strip().splitlines()[-1]

    assert recipe().endswith("-m labutils lab --ip '127.0.0.1' --port '8888'")
    assert recipe("PORT=8899", "IP=0.0.0.0").endswith("-m labutils lab --ip '0.0.0.0' --port '8899'")


# --- a real start, as `make lab` does it ---

def _wait_for_line(log: Path, text: str, process: subprocess.Popen) -> str:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        out = log.read_text(errors="replace")
        if text in out:
            return out
        if process.poll() is not None:
            pytest.fail(f"`python -m labutils lab` exited with {process.returncode}:\n{out[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"no {text!r} within {START_S:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


def test_make_lab_serves_on_localhost_with_its_token_and_leaves_nothing(tmp_path):
    import psutil

    dirs = {name: tmp_path / name for name in ("runtime", "config", "data")}
    for path in dirs.values():
        path.mkdir()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(dirs["runtime"]), JUPYTER_CONFIG_DIR=str(dirs["config"]),
               JUPYTER_DATA_DIR=str(dirs["data"]), PYTHONUNBUFFERED="1")
    env.pop("JUPYTER_TOKEN", None)
    port = free_port()
    log = tmp_path / "lab.log"
    with open(log, "wb") as out:
        cli = subprocess.Popen([sys.executable, "-m", "labutils", "lab", "--port", str(port)], cwd=ROOT, env=env,
                               stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    started = []
    try:
        text = _wait_for_line(log, "ssh -N -L", cli)
        started = [psutil.Process(cli.pid), *psutil.Process(cli.pid).children(recursive=True)]
        (server,) = psutil.Process(cli.pid).children()
        info = lab.read_server_info(dirs["runtime"], server.pid)

        expected = lab.lab_command(sys.executable, NOTEBOOK_DIR, uid=os.geteuid(), port=port)
        assert server.cmdline()[-len(expected[4:]):] == expected[4:], "not make lab's command line"
        assert ("running as root" in text) is (os.geteuid() == 0)

        sockets = getattr(server, "net_connections", None) or server.connections  # psutil < 6
        listening = {c.laddr.ip for c in sockets(kind="inet") if c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}
        assert info.host == "127.0.0.1" and info.port == port and len(info.token) >= 32
        for path in ("api/status", "api/contents"):
            assert lab.answers(info, None, path) == 403, f"{path} without the token"
            assert lab.answers(info, "not-the-token", path) == 403, f"{path} with a wrong token"
            assert lab.answers(info, info.token, path) == 200, f"{path} with the token"
        assert info.lab_url() in text
        assert f"ssh -N -L 8888:127.0.0.1:{port} {lab.user_name()}@HOST" in text
    finally:
        stop_lab(cli)
    assert cli.poll() is not None
    left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"still running: {[p.cmdline() for p in left]}"
