"""The article's toy split (notebook 06), in exact integers: a two-layer network ReLU(x A) B split over
devices by columns of A and rows of B, which needs one all-reduce of the contributions, and the
split that fails, by rows of A, where ReLU meets partial sums: ReLU(a) + ReLU(b) is not ReLU(a + b).
Pure numpy; the same split on real ranks is `labutils.experiments.tensor_parallel.toy_worker`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labutils.core.inputs import LabInputError, check_int, check_whole

# x (1x2), A (2x4), ReLU, B (4x2). Pre-activations x A = [1, 1, -1, 4]: the third is 2 - 3 < 0.
TOY_X = np.array([[1, -1]], dtype=np.int64)
TOY_A = np.array([[2, 3, 2, 3],
                  [1, 2, 3, -1]], dtype=np.int64)
TOY_B = np.array([[2, -1],
                  [-1, 2],
                  [1, 3],
                  [-1, 2]], dtype=np.int64)
TOY_INPUT_MAX = 10**6  # |x| at most this: every product of the toy stays an exact int64


def toy_input(x) -> np.ndarray:
    """x as the toy's 1x2 row of whole numbers (int64); LabInputError naming x otherwise
    (not two numbers, a fraction, NaN, inf, text, more than `TOY_INPUT_MAX` in size)."""
    check_whole("x", x, low=-TOY_INPUT_MAX, high=TOY_INPUT_MAX)
    row = np.asarray(x, dtype=float)
    if row.size != 2:
        raise LabInputError(f"x must be one row of two whole numbers such as [[1, -1]], got {row.size} number(s)")
    return row.astype(np.int64).reshape(1, 2)


def relu(v):
    """max(v, 0) elementwise, for numpy integer or float arrays."""
    return np.maximum(v, 0)


def toy_whole(x=TOY_X, A=TOY_A, B=TOY_B) -> np.ndarray:
    """The whole network on one device: ReLU(x A) B."""
    x = toy_input(x)
    return relu(x @ A) @ B


@dataclass(frozen=True)
class ToySplit:
    """Per device d: its pre-activations x A_d, hidden ReLU(x A_d) and contribution ReLU(x A_d) B_d."""

    pre_activations: tuple[np.ndarray, ...]
    hidden: tuple[np.ndarray, ...]
    contributions: tuple[np.ndarray, ...]

    @property
    def total(self) -> np.ndarray:
        """What the all-reduce produces: the sum of the contributions."""
        return sum(self.contributions[1:], self.contributions[0])


def split_columns(n_columns: int, parts: int, name: str = "parts") -> list[slice]:
    parts = check_int(name, parts, low=1, high=n_columns)
    if n_columns % parts:
        raise LabInputError(f"{name}={parts} must divide the {n_columns} columns being split evenly")
    width = n_columns // parts
    return [slice(d * width, (d + 1) * width) for d in range(parts)]


def toy_split(x=TOY_X, A=TOY_A, B=TOY_B, parts: int = 2) -> ToySplit:
    """Column-parallel A, row-parallel B: device d owns A[:, cols_d] and B[cols_d, :].

    ReLU acts on each device's own hidden columns, which are whole values, so no exchange is
    needed before it; the only sum is of the final contributions (one all-reduce).
    """
    x = toy_input(x)
    pre, hid, con = [], [], []
    for cols in split_columns(A.shape[1], parts):
        p = x @ A[:, cols]
        pre.append(p)
        hid.append(relu(p))
        con.append(relu(p) @ B[cols, :])
    return ToySplit(tuple(pre), tuple(hid), tuple(con))


def toy_wrong_split(x=TOY_X, A=TOY_A, B=TOY_B) -> ToySplit:
    """The split that fails: A by rows (x by columns), ReLU applied to partial pre-activations.

    Device d holds x[:, d] A[d, :], only a partial sum of each pre-activation; applying ReLU
    before summing computes ReLU(a) + ReLU(b) where the network needs ReLU(a + b).
    """
    x = toy_input(x)
    pre, hid, con = [], [], []
    for d in range(A.shape[0]):
        p = x[:, d:d + 1] @ A[d:d + 1, :]
        pre.append(p)
        hid.append(relu(p))
        con.append(relu(p) @ B)
    return ToySplit(tuple(pre), tuple(hid), tuple(con))


def relu_of_sum_vs_sum_of_relu(a: int = 2, b: int = -3) -> tuple[int, int]:
    """(ReLU(a + b), ReLU(a) + ReLU(b)): (0, 2) for the article's 2 and -3."""
    a, b = (check_int(name, v, low=-TOY_INPUT_MAX, high=TOY_INPUT_MAX) for name, v in (("a", a), ("b", b)))
    return int(relu(a + b)), int(relu(a) + relu(b))
