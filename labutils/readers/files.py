"""A file a user names (a saved `nvidia-smi topo -m`, an nccl-tests log, NCCL_DEBUG=INFO output,
`lspci -vvv`) read as text, with one line naming the parameter when it cannot be: the readers'
one door for files."""

from __future__ import annotations

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
