"""How many repetitions a measurement gets from a time budget (pure: no torch).

A repetition ("round") is everything one sample costs: barriers, untimed line-up steps,
reference passes and every variant timed side by side. The worker times one complete round on
the wall clock after warm-up and hands its length here; rank 0 then broadcasts the result
(labutils.measure.timing.agree_reps), so every rank runs the same count and they stop together.

    reps = clamp(floor(share_s / round_s), min_reps, max_reps)

The budget of a call is shared over its sizes (`share_budget`): `min_reps` rounds each, the rest
evenly, and what a size capped by `max_reps` cannot use is shared again over the others. When
even `min_reps` rounds of every size do not fit, the largest sizes are dropped first (`fit_sizes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Reps:
    """A repetition count and why: `budget_cut` when the budget, not `max_reps`, set the count;
    `fits` when `min_reps` rounds fit in the share (else the count is `min_reps`, over the share)."""

    reps: int
    budget_cut: bool
    fits: bool


def plan_reps(round_s: float, share_s: float, min_reps: int, max_reps: int) -> Reps:
    """Repetitions of a `round_s`-second round that fit in `share_s` seconds, within [min_reps, max_reps].

    reps = min(max_reps, max(min_reps, floor(share_s / round_s))); a round of 0 s gets max_reps.
    """
    want = math.floor(share_s / round_s) if round_s > 0 else max_reps
    reps = min(max_reps, max(min_reps, want))
    return Reps(int(reps), budget_cut=want < max_reps, fits=min_reps * round_s <= share_s)


def share_budget(round_s_per_size, budget_s: float, min_reps: int, max_reps: int) -> list[float]:
    """Seconds of `budget_s` for each size: first `min_reps` rounds each, then what is left split
    evenly, where a size that reaches `max_reps` keeps only that and leaves the rest to the others.

    share_i = min_reps round_i + extra_i, extra_i = min(left / sizes left, (max_reps - min_reps) round_i)
    (the sizes with the least room first); the shares add up to budget_s when every size reaches
    neither its cap nor the floor, never to more once min_reps rounds of all fit (`fit_sizes`).
    """
    rounds = [float(r) for r in round_s_per_size]
    extra = [0.0] * len(rounds)
    left_s, left_n = max(0.0, float(budget_s) - min_reps * sum(rounds)), len(rounds)
    for i in sorted(range(len(rounds)), key=lambda k: rounds[k]):
        extra[i] = min(left_s / left_n, (max_reps - min_reps) * rounds[i])
        left_s, left_n = left_s - extra[i], left_n - 1
    return [min_reps * r + e for r, e in zip(rounds, extra)]


def fit_sizes(round_s_per_size, budget_s: float, min_reps: int) -> tuple[list[int], list[int]]:
    """(kept, dropped) indices of sizes given smallest first: the largest (last) sizes are dropped
    until `min_reps` rounds of every kept one fit in `budget_s`, min_reps * sum(round_s of kept)
    <= budget_s. The smallest size is always kept (its count is then `min_reps`, over the budget,
    and its Reps says it does not fit).
    """
    rounds = [float(r) for r in round_s_per_size]
    kept = list(range(len(rounds)))
    while len(kept) > 1 and min_reps * sum(rounds[k] for k in kept) > budget_s:
        kept.pop()
    return kept, list(range(len(kept), len(rounds)))


def dropped_sentence(dropped: list, budget_s: float, min_reps: int) -> str:
    """One sentence for the notebook: which sizes the budget left out, or that none was."""
    if not dropped:
        return f"Every size fitted the {budget_s:g} s budget."
    names = ", ".join(str(d) for d in dropped)
    return (f"Left out for time: {names} (not even {min_reps} repetitions fitted the {budget_s:g} s budget); "
            "give a larger budget_s to measure them.")
