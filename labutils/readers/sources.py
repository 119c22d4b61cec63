"""Where a reader's text comes from: a file a user names (a saved `nvidia-smi topo -m`, an nccl-tests
log, NCCL_DEBUG=INFO output, `lspci -vvv`), read with one line naming the parameter when it cannot
be (`read_text`), or one of the machine's own tools run for its output (`tool_output`:
`run_nvidia_smi` for `nvidia-smi topo -m`, `run_lspci` for `lspci -vvv`). The live
readers built on `tool_output` return (text, "") or (None, why not), so every caller can say in one
line why a live reading is missing and go on with a file instead."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from labutils.core.inputs import LabInputError


def read_text(path, name: str, hint: str = "") -> str:
    """The text of the file at `path`, undecodable bytes replaced; LabInputError naming `name` when
    the path is empty, a directory, missing, not a regular file or unreadable. `hint` ends the
    message (what to give instead)."""
    text = str(path)
    p = Path(text).expanduser()
    try:
        if not text.strip():
            problem = "names no file"
        elif p.is_dir():
            problem = "is a directory (a folder), not a file"
        elif not p.exists():
            problem = "does not exist"
        elif not p.is_file():
            problem = "is not a regular file (a device or a pipe)"
        else:
            return p.read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError) as exc:  # a name too long or holding a NUL byte, no permission
        problem = f"cannot be read ({type(exc).__name__}: {exc})"
    raise LabInputError(f"{name}={text!r} {problem}{hint}")


def tool_output(argv: list[str], missing: str, timeout_s: float = 15.0,
                shown: str | None = None) -> tuple[str | None, str]:
    """(standard output of `argv`, "") or (None, why not): `missing` when argv[0] is not on PATH;
    "<shown> did not answer within T s" past `timeout_s`; "<shown> failed (status): <stderr>" when it
    exits non-zero or prints nothing. `shown` names the command in those lines (default: argv)."""
    shown = shown or " ".join(argv)
    exe = shutil.which(argv[0])
    if exe is None:
        return None, missing
    try:
        done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"{shown} did not answer within {timeout_s:g} s"
    except OSError as exc:
        return None, f"{shown} could not start ({exc})"
    if done.returncode != 0 or not done.stdout.strip():
        return None, f"{shown} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[:200]}"
    return done.stdout, ""


def run_nvidia_smi(timeout_s: float = 15.0) -> tuple[str | None, str]:
    """(`nvidia-smi topo -m` output, "") or (None, why not)."""
    return tool_output(["nvidia-smi", "topo", "-m"], "nvidia-smi is not installed on this machine (no NVIDIA driver)",
                       timeout_s, "nvidia-smi topo -m")


def run_lspci(timeout_s: float = 15.0) -> tuple[str | None, str]:
    """(`lspci -vvv` output, "") or (None, why not)."""
    return tool_output(["lspci", "-D", "-vvv"], "lspci is not installed (package pciutils)", timeout_s, "lspci -vvv")
