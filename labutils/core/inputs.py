"""Input checks shared by every module: one clear message naming the parameter, value and range
(numbers, counts, folders to write in);
and the numbers the models take, numbers and arrays alike (`as_float_array`, `float_or_array`,
`safe_divide`).

The models take numbers or arrays broadcast together (a slider value, or a grid for a figure),
checked here (`check_range`, `check_broadcast`) and computed on as float arrays, so a division
whose denominator can reach zero is written once, here, as `safe_divide`.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np


class LabInputError(ValueError):
    """Bad input from a user. The CLI turns it into one line on stderr and exit status 2."""


def _values(value):
    """The numbers of `value` as a flat float array; TypeError for None, text, booleans and
    containers of them (a number given as text is a slip, not a number)."""
    if value is None or isinstance(value, (str, bytes, bool, np.bool_)):
        raise TypeError(value)
    raw = np.asarray(value)
    if raw.dtype.kind in "USVb" or (raw.dtype.kind == "O" and any(
            v is None or isinstance(v, (str, bytes, bool)) for v in raw.ravel())):
        raise TypeError(value)
    return np.asarray(value, dtype=float).ravel()


def check_range(name: str, value, *, low: float = -math.inf, high: float = math.inf,
                low_open: bool = False, high_open: bool = False, unit: str = "") -> None:
    """Raise LabInputError unless every element of `value` is a number inside the given interval.

    `low_open`/`high_open` exclude the bound itself. NaN is always rejected.
    """
    try:
        vals = _values(value)
    except (TypeError, ValueError):
        raise LabInputError(f"{name} must be a number, got {_short(value)}") from None
    except OverflowError:  # an int past float's range (10**400): no quantity of the lab is that large
        raise LabInputError(f"{name}={_short(value)} is too large to be a number of this lab") from None
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    lo = "-inf" if low == -math.inf else f"{low:g}"
    hi = "inf" if high == math.inf else f"{high:g}"
    allowed = f"{left}{lo}, {hi}{right}" + (f" {unit}" if unit else "")
    bad = np.isnan(vals)
    bad |= (vals <= low) if low_open else (vals < low)
    bad |= (vals >= high) if high_open else (vals > high)
    if bad.any():
        shown = float(vals[bad][0])
        raise LabInputError(f"{name}={shown!r} is outside the allowed range {allowed}")


def check_number(name: str, value, **bounds) -> float:
    """`value` as one float inside `check_range`'s interval (same keywords); an array or a list is
    refused by name where one value is wanted."""
    if isinstance(value, (list, tuple, np.ndarray)) and np.asarray(value, dtype=object).ndim:
        raise LabInputError(f"{name} must be one number, got {_short(value)}")
    check_range(name, value, **bounds)
    return float(value)


def _short(value, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters: a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_int(name: str, value, *, low: int | None = None, high: int | None = None) -> int:
    """Return `value` as int, or raise LabInputError naming `name` and the allowed range.

    A whole float (2.0, numpy's 2.0) is that int; 2.5, NaN, inf, booleans and text are refused."""
    if isinstance(value, np.generic) and not isinstance(value, np.bool_):
        value = value.item()
    lo = "-inf" if low is None else str(low)
    hi = "inf" if high is None else str(high)
    whole = isinstance(value, (int, float)) and not isinstance(value, bool) and (
        isinstance(value, int) or float(value).is_integer())
    if not whole:
        raise LabInputError(f"{name} must be a whole number in [{lo}, {hi}], got {_short(value)}")
    ivalue = int(value)
    if (low is not None and ivalue < low) or (high is not None and ivalue > high):
        raise LabInputError(f"{name}={_short(ivalue)} is outside the allowed range [{lo}, {hi}]")
    return ivalue


def check_whole(name: str, value, *, low: float = 0, high: float = math.inf, unit: str = "") -> None:
    """`check_range` for counts (numbers or arrays): every element also a whole number, so 2.0
    passes and 2.5 is refused with one line naming the value."""
    check_range(name, value, low=low, high=high, high_open=math.isinf(high), unit=unit)
    vals = _values(value)
    frac = vals[np.mod(vals, 1) != 0]
    if frac.size:
        hi = "inf)" if math.isinf(high) else f"{high:g}]"
        raise LabInputError(f"{name}={float(frac[0])!r} is not a whole number: a count in [{low:g}, {hi}"
                            + (f" {unit}" if unit else ""))


def check_writable_dir(name: str, path) -> Path:
    """`path` as a Path when it is a folder this process can write files in, or one it can make;
    else LabInputError naming `name`: a file, a place that cannot be made (/proc/..., a read-only
    disk), a folder without write permission. Finding out leaves nothing behind: the folders
    made and the probe file written are removed again."""
    text = str(path)
    if not text.strip():
        raise LabInputError(f"{name}={text!r} names no folder; give one such as out/")
    made: list[Path] = []
    step = "cannot be read"
    try:
        target = Path(text).expanduser()
        if target.exists() and not target.is_dir():
            raise LabInputError(f"{name}={text!r} is a file, not a folder")
        missing, first = [], target
        while not first.exists():
            missing.append(first)
            first = first.parent
        if not first.is_dir():
            raise LabInputError(f"{name}={text!r} cannot be made: {str(first)!r} is a file, not a folder")
        step = "cannot be made"
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
        step = "is a folder no file can be written in"
        fd, probe = tempfile.mkstemp(dir=target, prefix=".lab-write-check-")
        os.close(fd)
        os.unlink(probe)
    except LabInputError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        why = getattr(exc, "strerror", None) or str(exc)
        raise LabInputError(f"{name}={text!r} {step} ({why}); give a folder this process can write") from None
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
    return target


def check_broadcast(**values) -> tuple[int, ...]:
    """The common shape of numbers and arrays given together; LabInputError naming them and their
    shapes when they do not broadcast (numpy's rules)."""
    shapes = {name: np.shape(v) for name, v in values.items()}
    try:
        return np.broadcast_shapes(*shapes.values())
    except ValueError:
        shown = ", ".join(f"{n} {s}" for n, s in shapes.items() if s)
        raise LabInputError(f"the array inputs do not broadcast together ({shown}); give numbers, or arrays "
                            "of one shape (or of shapes numpy can broadcast)") from None


def check_choice(name: str, value, choices) -> str:
    """Return `value` if it is one of `choices`, else raise LabInputError listing them."""
    try:
        known = value in choices
    except (TypeError, ValueError):  # an array compares elementwise: it is no choice
        known = False
    if not known:
        raise LabInputError(f"{name}={value!r} is not one of: {', '.join(map(str, choices))}")
    return value


# --- numbers and arrays alike -------------------------------------------------------------------
def as_float_array(x) -> np.ndarray:
    """x as a float numpy array (numbers and arrays broadcast together)."""
    return np.asarray(x, dtype=float)


def float_or_array(x):
    """A float for a 0-d result, else the array."""
    x = np.asarray(x, dtype=float)
    return float(x) if x.ndim == 0 else x


def safe_divide(num, den, default: float = math.inf, where=None) -> np.ndarray:
    """num / den elementwise where `where` holds (by default where den > 0), `default` elsewhere.

    The denominator is replaced by 1 where the division is not wanted, so nothing divides by zero
    and no warning is raised; e.g. a break-even H / f is "never" (inf) where the saved fraction f
    is 0 or less. Returns an array (0-d for numbers: see `float_or_array`).
    """
    num, den = as_float_array(num), as_float_array(den)
    ok = den > 0 if where is None else np.asarray(where, dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(ok, num / np.where(ok, den, 1.0), default)
