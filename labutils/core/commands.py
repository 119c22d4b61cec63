"""Running one of the machine's own tools (lspci, nvidia-smi) for its text: `tool_output` (a leaf).

The readers that call it are kept thin and return (text, "") or (None, why not), so every caller
can say in one line why a live reading is missing and go on with a file instead.
"""

from __future__ import annotations

import shutil
import subprocess


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
