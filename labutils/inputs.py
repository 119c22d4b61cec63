"""Input checks shared by every module: one clear message naming the parameter, value and range."""

from __future__ import annotations

import math

import numpy as np


class LabInputError(ValueError):
    """Bad input from a user. The CLI turns it into one line on stderr and exit status 2."""


def _values(value):
    return np.asarray(value, dtype=float).ravel()


def check_range(name: str, value, *, low: float = -math.inf, high: float = math.inf,
                low_open: bool = False, high_open: bool = False, unit: str = "") -> None:
    """Raise LabInputError unless every element of `value` is a number inside the given interval.

    `low_open`/`high_open` exclude the bound itself. NaN is always rejected.
    """
    try:
        vals = _values(value)
    except (TypeError, ValueError):
        raise LabInputError(f"{name} must be a number, got {value!r}") from None
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


def check_int(name: str, value, *, low: int | None = None, high: int | None = None) -> int:
    """Return `value` as int, or raise LabInputError naming `name` and the allowed range."""
    whole = isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer()
    if not whole:
        raise LabInputError(f"{name} must be a whole number, got {value!r}")
    ivalue = int(value)
    if (low is not None and ivalue < low) or (high is not None and ivalue > high):
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        raise LabInputError(f"{name}={ivalue} is outside the allowed range [{lo}, {hi}]")
    return ivalue


def check_choice(name: str, value, choices) -> str:
    """Return `value` if it is one of `choices`, else raise LabInputError listing them."""
    if value not in choices:
        raise LabInputError(f"{name}={value!r} is not one of: {', '.join(map(str, choices))}")
    return value
