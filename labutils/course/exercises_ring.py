"""Graders of notebooks 04 (the ring by hand) and 05 (predicting all-reduce): the ring's bytes and
steps, the hand ring against the library's, the bandwidth-only all-reduce time, and the ranks at
which the ring's latency term passes a limit."""

from __future__ import annotations

import math

from labutils.core.busbw import bus_factor
from labutils.core.inputs import LabInputError, check_int, check_range
from labutils.course.grading import GiB_PER_GB, check_prediction, grade, read_whole
from labutils.model.fit import MAX_WORLD_SIZE, allreduce_ms, latency_term_us
from labutils.model.ring import ring_bytes_per_rank

# --- 04 · the ring by hand ----------------------------------------------------------------------------


def check_ratio_prediction(predicted, measured: float, what: str = "hand ring time / gloo all_reduce time") -> str:
    """Notebook 04: the predicted ratio hand ring / gloo all_reduce time against the measured one."""
    why = ("Hint: the library's all-reduce is the same ring (or a smarter algorithm) in C++, without a Python call "
           "per step: small messages pay the per-step overhead 2(N-1) times in the hand ring, large ones are "
           "limited by the same bytes on the same links.")
    return check_prediction(predicted, measured, "x", f"the ratio {what}", why)


def check_ring_bytes(answer_bytes, size_bytes: float = 1e8, world_size: int = 8) -> str:
    """Notebook 04: bytes each rank sends in a ring all-reduce, 2(N-1)/N x size."""
    try:
        n = check_int("world_size", world_size, low=1, high=MAX_WORLD_SIZE)
        check_range("size_bytes", size_bytes, low=0, low_open=True, high=math.inf, high_open=True, unit="bytes")
        size_bytes = float(size_bytes)
        right = float(ring_bytes_per_rank(size_bytes, n))
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [((n - 1) / n * size_bytes, "that is one phase only; the all-gather sends as much again."),
             (size_bytes / n, "that is one chunk, one step; there are 2(N-1) steps."),
             (2 * size_bytes, "that is the limit for very many ranks; at this N the factor is 2(N-1)/N."),
             ((n - 1) * size_bytes, "that is what rank 0 would receive in the naive gather-to-one."),
             (size_bytes, "that is the buffer once; each rank sends 2(N-1) chunks of size/N.")]
    return grade(answer_bytes, right, slips, "bytes", "Each of the 2(N-1) steps sends one chunk of size/N bytes.",
                 rel_tol=0.005, right_text=f"2(N-1)/N x size = {2 * (n - 1)}/{n} x {size_bytes:.4g}.")


def check_ring_steps(answer_steps, world_size: int = 8) -> str:
    """Notebook 04: the point-to-point steps in a row of a ring all-reduce, 2(N-1) (exact)."""
    try:
        n = check_int("world_size", world_size, low=2, high=MAX_WORLD_SIZE)
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    answer, hint = read_whole(answer_steps, "steps")
    if answer is None:
        return hint
    right = 2 * (n - 1)
    if answer == right:
        return f"Right: N-1 = {n - 1} reduce-scatter steps and {n - 1} all-gather steps, {right} in a row."
    slips = {n - 1: "that is one phase; the all-gather takes as many steps again.",
             2 * math.ceil(math.log2(n)): "that is a tree's count (up and down, log2 N each way); the ring passes "
                                          "every rank.",
             n: "that is one step per rank; each phase takes N-1 steps (a rank never sends to itself), and there "
                "are two phases.",
             2 * n: "that counts N steps per phase; each phase takes N-1 (a rank never sends to itself)."}
    if answer in slips:
        return f"Not yet ({answer}): {slips[answer]}"
    return f"Not yet ({answer}). Count the panels of the drawing above for N = 4, then generalise."


# --- 05 · predicting all-reduce ------------------------------------------------------------------------


def check_allreduce_prediction(answer_ms, size_bytes: float, world_size: int, busbw_GBps: float) -> str:
    """Notebook 05: the bandwidth-only all-reduce time 2(N-1)/N x bytes / busbw, in ms.

    Slips: the factor left out, one phase ((N-1)/N), the answer in s or us, busbw read as Gb/s
    or GiB/s, the factor's limit 2."""
    try:
        check_range("busbw_GBps", busbw_GBps, low=0, low_open=True, high=math.inf, high_open=True, unit="GB/s")
        right = float(allreduce_ms(size_bytes, world_size, busbw_GBps))
        factor = bus_factor("all_reduce", world_size)
        bare = size_bytes / (busbw_GBps * 1e6)
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [(bare, f"that is bytes / busbw alone; multiply by the ring factor 2(N-1)/N = {factor:.4g}."),
             (bare * factor / 2, "that is one phase, (N-1)/N; reduce-scatter and all-gather each move as much."),
             (2 * bare, "that uses the factor's limit 2; at this N it is 2(N-1)/N."),
             (right * 8, "that is 8 times the answer: busbw read as gigabits (Gb/s); GB/s counts bytes."),
             (right / GiB_PER_GB, "that is 1.0737 times the answer: GiB (2^30 bytes) used for GB (1e9 bytes).")]
    how = "Compute factor = 2(N-1)/N, then factor x bytes / (busbw x 1e9) seconds, then convert to ms."
    tail = ("With one rank nothing travels: the factor 2(N-1)/N is 0." if factor == 0 else
            "Doubling N from here barely changes it: the factor tends to 2." if factor >= 1.5 else
            f"The factor is {factor:.4g} here and tends to 2 as N grows.")
    return grade(answer_ms, right, slips, "ms", how, right_text=tail)


def ring_latency_ranks(alpha_step_us: float = 5.0, limit_us: float = 100.0, algorithm: str = "ring") -> int:
    """The smallest N whose latency term (`fit.latency_term_us`) is strictly above `limit_us`.

    ring: 2(N-1) a > L  =>  N = floor(L / 2a) + 2;  tree: 2 ceil(log2 N) a > L  =>  N = 2^floor(L / 2a) + 1.
    LabInputError when no N up to `fit.MAX_WORLD_SIZE` is (a step of no cost, a limit too far)."""
    check_range("alpha_step_us", alpha_step_us, low=0, low_open=True, high=math.inf, high_open=True, unit="us")
    check_range("limit_us", limit_us, low=0, high=math.inf, high_open=True, unit="us")
    steps = math.floor(min(float(limit_us) / (2 * float(alpha_step_us)), 2.0 * MAX_WORLD_SIZE))
    n = steps + 2 if algorithm == "ring" else 2 ** min(steps, 40) + 1
    while 2 < n <= MAX_WORLD_SIZE + 1 and latency_term_us(n - 1, alpha_step_us, algorithm) > limit_us:
        n -= 1  # the float floor may land one above
    while n <= MAX_WORLD_SIZE and latency_term_us(n, alpha_step_us, algorithm) <= limit_us:
        n += 1  # ... or one below
    if n > MAX_WORLD_SIZE:
        raise LabInputError(f"limit_us={float(limit_us):g} is above the latency term of any N up to "
                            f"{MAX_WORLD_SIZE} ranks at alpha_step_us={float(alpha_step_us):g}")
    return n


def check_ring_latency_ranks(answer, alpha_step_us: float = 5.0, limit_us: float = 100.0,
                             table_ns=(2, 4, 8, 16, 32, 64, 128)) -> str:
    """Notebook 05: the smallest whole N (any N, not only the powers of two of 04's table) at which a
    ring's latency term 2(N-1) x alpha_step is more than `limit_us`. Slips: "at least" for "more than", the table's
    powers of two, one phase, N steps, the tree."""
    value, hint = read_whole(answer, "ranks", low=1)
    if value is None:
        return hint
    try:
        right = ring_latency_ranks(alpha_step_us, limit_us)
        alpha_step_us, limit_us = float(alpha_step_us), float(limit_us)
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    if value > MAX_WORLD_SIZE:
        return f"Not yet ({value}): far too many; solve 2(N-1) x {alpha_step_us:g} us > {limit_us:g} us for N."
    if value == right:
        return (f"Right: N = {right}, 2({right}-1) x {alpha_step_us:g} = "
                f"{latency_term_us(right, alpha_step_us):g} us > {limit_us:g} us; N = {right - 1} gives "
                f"{latency_term_us(right - 1, alpha_step_us):g} us.")
    above = [n for n in table_ns if n > right]
    below = [n for n in table_ns if n < right]
    slips = {}
    if latency_term_us(right - 1, alpha_step_us) == limit_us:
        slips[right - 1] = (f"at N = {right - 1} the term is exactly {limit_us:g} us; the question asks for more "
                            "than that.")
    if above:
        slips.setdefault(above[0], f"{above[0]} is the first power of two above {limit_us:g} us (notebook 04's table), "
                                   "but N need not be one: solve 2(N-1) x alpha_step > limit for a whole N.")
    if below:
        slips.setdefault(below[-1], f"at N = {below[-1]} the term is {latency_term_us(below[-1], alpha_step_us):g} "
                                    f"us, not yet above {limit_us:g}.")
    k = math.floor(limit_us / alpha_step_us) + 2  # the smallest k with (k - 1) alpha > limit
    slips.setdefault(k, "that counts one phase, N-1 steps; the ring's latency term is 2(N-1) steps.")
    slips.setdefault(k - 1, "that counts N steps; the ring takes 2(N-1) steps, N-1 per phase.")  # k alpha > limit
    tree = ring_latency_ranks(alpha_step_us, limit_us, "tree") if limit_us / alpha_step_us < 60 else None
    if tree:
        slips.setdefault(tree, "that is the tree's N (2 log2 N steps); the question is about the ring.")
    if value in slips:
        return f"Not yet ({value}): {slips[value]}"
    return (f"Not yet ({value}: the term is {latency_term_us(value, alpha_step_us):g} us). Solve "
            f"2(N-1) x {alpha_step_us:g} us > {limit_us:g} us for the smallest whole N.")
