"""Where a reader's text comes from: a file a user names (a saved `nvidia-smi topo -m`, an nccl-tests
log, NCCL_DEBUG=INFO output, `lspci -vvv`), read with one line naming the parameter when it cannot
be (`read_text`), or one of the machine's own tools run for its output (`tool_output`:
`run_nvidia_smi` for `nvidia-smi topo -m`, `run_lspci` for `lspci -vvv`). The live
readers built on `tool_output` return (text, "") or (None, why not), so every caller can say in one
line why a live reading is missing and go on with a file instead."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

from labutils.core.inputs import LabInputError

MAX_TEXT_BYTES = 64_000_000  # 64 MB, decimal: far above the logs and matrices read here; cut a bigger file first
_UNDECODABLE_SHARE = 0.1  # text with more than 1 in 10 characters undecodable is binary, not a log in another code
# what a file that is not text usually is, by its first bytes
_MAGIC = ((b"\x1f\x8b", "gzip-compressed data (unpack it first: gunzip)"),
          (b"PK\x03\x04", "a zip archive (unpack it first)"),
          (b"\xfd7zXZ\x00", "xz-compressed data (unpack it first: unxz)"),
          (b"BZh", "bzip2-compressed data (unpack it first: bunzip2)"),
          (b"\x28\xb5\x2f\xfd", "zstd-compressed data (unpack it first: unzstd)"),
          (b"\x7fELF", "a program (an ELF executable), not its output"),
          (b"%PDF", "a PDF document, not text"),
          (b"\x89PNG", "a PNG image, not text"),
          (b"SQLite format 3\x00", "an SQLite database, not text"))
_KINDS = ((stat.S_ISDIR, "is a directory (a folder), not a file"),
          (stat.S_ISFIFO, "is a named pipe (FIFO), not a regular file; save the output to a file first"),
          (stat.S_ISCHR, "is a character device, not a regular file"),
          (stat.S_ISBLK, "is a block device, not a regular file"),
          (stat.S_ISSOCK, "is a socket, not a regular file"))


def _decode(data: bytes) -> tuple[str | None, str]:
    """(text, "") or (None, what the bytes look like). UTF-16 with its byte-order mark (what Windows
    PowerShell's `>` writes) and UTF-8 with one are read as text; NUL bytes or more than
    _UNDECODABLE_SHARE undecodable characters mean binary data."""
    for magic, what in _MAGIC:
        if data.startswith(magic):
            return None, f"holds {what}"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16"), ""
        except UnicodeDecodeError:
            pass
    if b"\x00" in data:
        return None, "holds binary data (NUL bytes), not text"
    text = data.decode("utf-8-sig", errors="replace")
    bad = text.count("\ufffd") - data.decode("utf-8-sig", errors="ignore").count("\ufffd")
    if text and bad > _UNDECODABLE_SHARE * len(text):
        return None, f"holds binary data ({bad} of {len(text)} characters are not UTF-8), not text"
    return text, ""


def read_text(path, name: str, hint: str = "", max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The text of the regular file at `path` (UTF-8, undecodable bytes replaced; UTF-16 with a
    byte-order mark too), at most `max_bytes` long. LabInputError, one line naming `name` and the
    path, when the path is empty, missing, a folder, a FIFO, a device or a socket (stat only: a
    pipe is never opened, so nothing waits), unreadable (permission), over `max_bytes`, or binary
    (NUL bytes, mostly undecodable, or a known binary format: compressed, an executable).
    `hint` ends the message (what to give instead)."""
    text = str(path)
    p = Path(text).expanduser()
    try:
        if not text.strip():
            raise _Refused("names no file")
        try:
            st = p.stat()
        except FileNotFoundError:
            raise _Refused("does not exist") from None
        except NotADirectoryError:
            raise _Refused("does not exist (a part of the path is a file, not a folder)") from None
        except PermissionError:
            raise _Refused("cannot be reached (permission denied on a folder of the path)") from None
        for test, what in _KINDS:
            if test(st.st_mode):
                raise _Refused(what)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused("is not a regular file")
        if st.st_size > max_bytes:
            raise _Refused(f"is {st.st_size / 1e6:.1f} MB, over the {max_bytes / 1e6:g} MB this reader takes "
                           "(cut out the part you need)")
        try:
            with open(p, "rb") as f:  # a regular file: open and read never wait
                data = f.read(max_bytes + 1)
        except PermissionError:
            raise _Refused("cannot be read: permission denied (check its owner and mode)") from None
        except IsADirectoryError:
            raise _Refused(_KINDS[0][1]) from None
        if len(data) > max_bytes:  # it grew, or /proc-like files that report size 0
            raise _Refused(f"is over the {max_bytes / 1e6:g} MB this reader takes (cut out the part you need)")
        decoded, looks = _decode(data)
        if decoded is None:
            raise _Refused(looks)
        return decoded
    except _Refused as why:
        problem = str(why)
    except (OSError, ValueError) as exc:  # a name too long or holding a NUL byte, an I/O error
        problem = f"cannot be read ({type(exc).__name__}: {exc})".replace("\n", " ")
    raise LabInputError(f"{name}={text!r} {problem}{hint}")


class _Refused(Exception):
    """Why read_text refuses a path (turned into the one-line LabInputError)."""


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
