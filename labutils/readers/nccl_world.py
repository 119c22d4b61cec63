"""How many ranks an nccl-tests log ran on: `decide_world_size` weighs what the log says (the header's
thread and GPU counts, the command line, NCCL INFO lines, the rank lines) against what its numbers
say (busbw / algbw is the bus factor of N ranks), and says why when they disagree.
Used by labutils.readers.nccl_tests (notebook 02's reading of a real nccl-tests run).
"""

from __future__ import annotations

import math

from labutils.core.busbw import bus_factor
from labutils.core.inputs import LabInputError

MAX_RANKS = 1 << 20  # far above any job; a larger count in a log is a corrupt line
RATIO_OPS = ("all_reduce", "all_gather", "reduce_scatter")  # ops whose busbw/algbw depends on N


def _bandwidth_pairs(rows: list[dict]) -> list[tuple[float, float]]:
    """(algbw, busbw) of every row that printed both as finite numbers, algbw > 0."""
    return [(r["algbw_GBps"], r["busbw_GBps"]) for r in rows
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (r["algbw_GBps"], r["busbw_GBps"]))
            and r["algbw_GBps"] > 0]


def _fits(pairs: list[tuple[float, float]], op: str, n: int) -> bool:
    """Whether busbw = algbw * factor(n) on every pair, within the columns' rounding (2 decimals,
    or 4 significant figures)."""
    def slack(v):
        return max(0.0051, 6e-4 * abs(v))

    factor = bus_factor(op, n)
    return all(abs(a * factor - b) <= slack(b) + factor * slack(a) for a, b in pairs)


def _n_from_ratio(rows: list[dict], op: str) -> int | None:
    """N from busbw = algbw * factor(N) on every row with a bandwidth: the one N whose factor
    reproduces each printed busbw within its rounding (2 decimals, or 4 significant figures), else None."""
    if op not in RATIO_OPS:
        return None
    pairs = _bandwidth_pairs(rows)
    if not pairs:
        return None
    alg, bus = max(pairs)
    ratio = bus / alg
    top = 2.0 if op == "all_reduce" else 1.0
    if not 0 <= ratio < top:
        return None
    guess = round(top / (top - ratio))
    if not 1 <= guess <= MAX_RANKS:
        return None
    near = [n for n in (guess - 1, guess + 1) if n >= 1 and _fits(pairs, op, n)]
    return guess if _fits(pairs, op, guess) and not near else None


def _ranks_tell(ranks: list[int], rows: list[dict], op: str) -> bool:
    """Whether the # Rank lines 0..k-1 can be the whole world: a log cut to its tail may keep only
    the first ranks, so k counts only when the bandwidth columns fit k ranks and rule out k + 1."""
    if not ranks or ranks != list(range(len(ranks))):
        return False
    pairs = _bandwidth_pairs(rows) if op in RATIO_OPS else []
    if not pairs:
        return True  # no numbers to hold them against
    return _fits(pairs, op, len(ranks)) and not _fits(pairs, op, len(ranks) + 1)


def decide_world_size(evidence: dict, rows: list[dict], op: str, nranks: int | None = None) -> tuple[int | None, str]:
    """(N, which source decided and which agree) from every source a log has; LabInputError when
    two disagree.

    Sources: `nranks` (the caller's override), NCCL INFO's `nranks` (exact), the header's nThread x
    nGpus and the command line's -g (ranks per process: the world size for one process, a multiple
    of it across processes), the busbw/algbw ratio (exact where it singles out one N) and the `# Rank`
    lines (a lower bound: a log cut to its tail keeps only some; the world size only when nothing
    else speaks).
    """
    exact: list[tuple[str, int]] = []
    if nranks is not None:
        exact.append(("--nranks", nranks))
    exact += list(evidence.get("exact", {}).items())
    per_process = evidence.get("per_process", {})
    multi = evidence.get("processes", 0) > 1
    if not multi:
        exact += [(name, n) for name, n in per_process.items()]
    ratio_n = _n_from_ratio(rows, op)
    if ratio_n is not None:
        exact.append(("busbw/algbw", ratio_n))
    ranks = evidence.get("ranks", [])
    at_least = max(len(ranks), ranks[-1] + 1) if ranks else 0

    def says(name, n):
        return f"{name} says {n}"

    if exact:
        name, world = exact[0]
        clash = [(m, n) for m, n in exact[1:] if n != world]
        if clash:
            raise LabInputError(f"world size: the log disagrees with itself: {says(name, world)}, "
                                + ", ".join(says(m, n) for m, n in clash)
                                + "; give the true rank count with --nranks only if the log is yours and complete")
        if world < at_least:
            raise LabInputError(f"world size: {says(name, world)} but the log lists a # Rank line for rank "
                                f"{ranks[-1]} ({at_least} ranks at least)")
        bad = [(m, p) for m, p in per_process.items() if world % p]
        if bad:
            raise LabInputError(f"world size: {says(name, world)} but {bad[0][0]} ({bad[0][1]} ranks per process) "
                                "does not divide it")
        agree = [m for m, _ in exact[1:]] + (["# Rank lines"] if ranks else [])
        return world, name + (f" (agrees: {', '.join(agree)})" if agree else "")
    if _ranks_tell(ranks, rows, op):
        return len(ranks), f"{len(ranks)} # Rank lines (nothing else in the log gives the rank count)"
    return None, "unknown: no source in the log gives the rank count (give --nranks)"
