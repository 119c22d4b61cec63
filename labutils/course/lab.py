"""Opening the lab in a browser: JupyterLab on notebooks/, safe by default on a rented GPU box.

`python -m labutils lab [--ip 127.0.0.1] [--port 8888]` (what `make lab` runs) starts JupyterLab
bound to 127.0.0.1 with a token and `notebooks/` as its root folder. Run as root (uid 0, as in most
rented GPU containers) it adds `--allow-root` and says so; asked for a non-loopback address such as
0.0.0.0 it warns that the token is then the only protection. Once the server answers it prints the
URL with its token and the SSH tunnel command to run on the laptop.

How the URL is learnt. JupyterLab may not get the port it was asked for (when the port is in use it
tries others), and the token it checks may be one it generated, `$JUPYTER_TOKEN`, or a config
file's. Once the port is chosen the server writes both, as it holds them, into
`jpserver-<pid>.json` in Jupyter's runtime directory; `wait_for_lab` reads that file for the
server's own pid and then waits until the API answers with that token. So the URL printed is the one
the server enforces, whatever set the token, and the token never appears on a command line (where
`ps` shows it to every user of the machine).
"""

from __future__ import annotations

import getpass
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from jupyter_core.paths import jupyter_runtime_dir

from labutils.core.inputs import LabInputError, check_int
from labutils.course.runner import NOTEBOOK_DIR

DEFAULT_IP = "127.0.0.1"
DEFAULT_PORT = 8888
LAPTOP_PORT = 8888  # the port the tunnel opens on the laptop
START_TIMEOUT_S = 120.0


def check_ip(ip: str) -> str:
    """`ip` if it is an IPv4 or IPv6 address, else LabInputError naming --ip."""
    try:
        return str(ipaddress.ip_address(str(ip).strip("[]")))
    except ValueError:
        raise LabInputError(f"--ip must be an IP address such as 127.0.0.1 (this machine only) or "
                            f"0.0.0.0 (every network interface), got {ip!r}") from None


def check_port(port) -> int:
    """`port` as an int in [1, 65535], else LabInputError naming --port."""
    try:
        port = int(str(port).strip())
    except ValueError:
        raise LabInputError(f"--port must be a whole number in [1, 65535], got {port!r}") from None
    return check_int("--port", port, low=1, high=65535)


def lab_command(python: str, root_dir: Path, *, uid: int, ip: str = DEFAULT_IP,
                port: int = DEFAULT_PORT) -> list[str]:
    """The JupyterLab command line `make lab` runs (a pure function: uid, ip and port are given).

    Root (uid 0) gets `--allow-root`, since JupyterLab refuses to start as root without it. The
    token is left on: JupyterLab generates one unless `$JUPYTER_TOKEN` or a config file sets it.
    """
    command = [python, "-m", "jupyter", "lab", "--no-browser", f"--ServerApp.ip={check_ip(ip)}",
               f"--ServerApp.port={check_port(port)}", f"--ServerApp.root_dir={root_dir}"]
    if uid == 0:
        command.append("--allow-root")
    return command


def start_notes(uid: int, ip: str) -> list[str]:
    """The lines said before JupyterLab starts: root, and an address other than loopback."""
    notes = []
    if uid == 0:
        notes.append("lab: running as root (uid 0), so --allow-root is added (JupyterLab refuses root "
                     "without it); the address and the token are unchanged.")
    if not ipaddress.ip_address(ip).is_loopback:
        notes.append(f"lab: warning: --ip {ip} lets other machines reach this server, and its token is "
                     "then the only protection; the default 127.0.0.1 with an SSH tunnel opens no port.")
    return notes


def url_host(ip: str) -> str:
    """The host to put in a URL or a tunnel for a server bound to `ip` (0.0.0.0 -> 127.0.0.1)."""
    addr = ipaddress.ip_address(ip)
    if addr.is_unspecified:
        return "127.0.0.1"
    return f"[{addr}]" if addr.version == 6 else str(addr)


@dataclass(frozen=True)
class ServerInfo:
    """What a running Jupyter server wrote about itself (its jpserver-<pid>.json)."""

    host: str  # as bound, e.g. 127.0.0.1 or 0.0.0.0
    port: int
    token: str  # "" when a config file turned the token off
    base_url: str = "/"
    secure: bool = False
    password: bool = False

    def root_url(self, port: int | None = None) -> str:
        """The server's root URL, ending in '/'; `port` replaces its own (the laptop's end of a tunnel)."""
        scheme = "https" if self.secure else "http"
        return f"{scheme}://{url_host(self.host)}:{port or self.port}{self.base_url}"

    def lab_url(self, port: int | None = None) -> str:
        """The JupyterLab page with its token (see root_url for `port`)."""
        return f"{self.root_url(port)}lab" + (f"?token={self.token}" if self.token else "")


def read_server_info(runtime_dir: Path, pid: int) -> ServerInfo | None:
    """The ServerInfo in `runtime_dir/jpserver-<pid>.json`, or None while it is missing or half written."""
    try:
        data = json.loads((Path(runtime_dir) / f"jpserver-{pid}.json").read_text(encoding="utf-8"))
        return ServerInfo(host=data["hostname"], port=int(data["port"]), token=data.get("token") or "",
                          base_url=data.get("base_url") or "/", secure=bool(data.get("secure")),
                          password=bool(data.get("password")))
    except (OSError, ValueError, KeyError):
        return None


def answers(info: ServerInfo, token: str | None = None, path: str = "api/status") -> int:
    """HTTP status of GET `path` on the server, sending `token` (None: send none); 0 if no answer."""
    request = urllib.request.Request(info.root_url() + path)
    if token:
        request.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError):
        return 0


class LabNotStarted(RuntimeError):
    """JupyterLab exited, or did not answer in time."""


def wait_for_lab(process: subprocess.Popen, runtime_dir: Path,
                 timeout_s: float = START_TIMEOUT_S) -> ServerInfo:
    """Wait until the server started as `process` has written its jpserver file and its API answers
    (with its token, when it has one); return what it wrote. LabNotStarted if it exits or `timeout_s` passes first.

    The file is written just before the server starts listening, hence the API check.
    """
    deadline = time.monotonic() + timeout_s
    info = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LabNotStarted(f"JupyterLab exited with status {process.returncode}")
        info = info or read_server_info(runtime_dir, process.pid)
        if info and answers(info, info.token):
            return info
        time.sleep(0.2)
    raise LabNotStarted(f"JupyterLab did not answer within {timeout_s:.0f} s")


def tunnel_command(user: str, host: str, port: int, laptop_port: int = LAPTOP_PORT) -> str:
    """The command a laptop runs to reach a server listening on `host:port` of this machine."""
    return f"ssh -N -L {laptop_port}:{host}:{port} {user}@HOST"


def banner(info: ServerInfo, user: str, asked_port: int) -> list[str]:
    """The lines printed once the lab answers: its URL with the token, and the tunnel for a laptop."""
    lines = [f"lab: JupyterLab is serving the notebooks at  {info.lab_url()}"]
    if info.port != asked_port:
        lines.append(f"lab: port {asked_port} was in use, so JupyterLab took port {info.port}.")
    if not info.token:
        lines.append("lab: warning: this server asks for no token (a Jupyter config file turned it off); "
                     + ("it asks for that file's password." if info.password
                        else "anyone who reaches it can run code."))
    lines += ["lab: on a remote machine, run this on your laptop (HOST: this machine's address):",
              f"         {tunnel_command(user, url_host(info.host), info.port)}",
              f"     then open  {info.lab_url(LAPTOP_PORT)}",
              "lab: Ctrl-C (twice) stops JupyterLab and its kernels."]
    return lines


def user_name() -> str:
    """This machine's login name for the tunnel command ("USER" when the system has none)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "USER"


def serve(ip: str = DEFAULT_IP, port=DEFAULT_PORT, root_dir: Path = NOTEBOOK_DIR) -> int:
    """Run JupyterLab in the foreground (as `make lab` does) and return its exit status.

    JupyterLab shares the terminal and answers Ctrl-C itself (it asks to confirm; twice stops it),
    so this process ignores Ctrl-C meanwhile and forwards SIGTERM; it never leaves the server behind.
    """

    ip, port, uid = check_ip(ip), check_port(port), os.geteuid()
    for line in start_notes(uid, ip):
        print(line, flush=True)
    process = subprocess.Popen(lab_command(sys.executable, root_dir, uid=uid, ip=ip, port=port))
    handlers = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: process.terminate())}
    try:
        try:
            info = wait_for_lab(process, Path(jupyter_runtime_dir()))
            print("\n".join(banner(info, user_name(), port)), flush=True)
        except LabNotStarted as err:
            if process.poll() is None:
                print(f"lab: {err}; its own log above names the URL.", flush=True)
        return process.wait()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=30)


def add_cli(sub) -> None:
    p = sub.add_parser("lab", help="JupyterLab on notebooks/ (127.0.0.1, token on) with the SSH tunnel to use")
    p.add_argument("--ip", default=DEFAULT_IP,
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 exposes it, token only)")
    p.add_argument("--port", default=str(DEFAULT_PORT),
                   help="port to ask for (default 8888; JupyterLab takes another when it is in use)")
    p.set_defaults(func=lambda args: serve(args.ip, args.port))
