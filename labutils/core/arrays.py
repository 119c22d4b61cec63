"""Numbers and arrays alike: the small numpy helpers the model modules share (a leaf: imports no
other labutils module).

The models take numbers or arrays broadcast together (a slider value, or a grid for a figure), so
a division whose denominator can reach zero is written once, here, as `safe_divide`.
"""

from __future__ import annotations

import math

import numpy as np


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
