"""Sizes from the machine: notebook 09's layers and notebook 10's models, chosen from what this
machine was measured to do, never from a per-route table. Pure functions: no torch, no files.

Three numbers describe the machine (`Rates`): one rank's fp32 GEMM rate F (flop/s, measured with
a short matrix product on the rank's device, `labutils.measure.compute_rate`), and the link's
latency alpha and busbw B (the saved link, `labutils.measure.my_link`). From them:

- 09, the split MLP block (ffn = 4H, b rows): one device computes C = 16 b H^2 / F; the split
  all-reduces V = 4 b H bytes. With N ranks at eta = 1, the split pays when
      C (1 - 1/N) > alpha + 2(N-1)/N * V / B,
  a quadratic in H whose root is the break-even hidden size H* (`break_even_hidden`). The sweep
  spans H* / 4 .. 4 H*, so the measured break-even falls inside on any machine.
- 10, data parallelism on an MLP of width w and depth d: a step computes 6 b w^2 d flops and
  all-reduces 4 w^2 d bytes, so compute / all-reduce = 0.75 b B N / (F (N - 1)) whatever the
  width. The per-rank batch b that makes them equal (`ddp_batch`) puts the two bounds of the step
  a factor ~1.5 apart, so the check between them means something; the widths then fill the budget.

How many repetitions fit (the second half of this module): a repetition ("round") is everything
one sample costs, barriers, untimed line-up steps, reference passes and every variant timed side
by side. The worker times one complete round on the wall clock after warm-up and hands its
length here; rank 0 then broadcasts the result (labutils.measure.timing.agree_reps), so every
rank runs the same count and they stop together:

    reps = clamp(floor(share_s / round_s), min_reps, max_reps)

A call's budget is shared over its sizes (`share_budget`): `min_reps` rounds each, the rest
evenly, and what a size capped by `max_reps` cannot use goes to the others. When even `min_reps`
rounds of every size do not fit, the largest sizes are dropped first (`fit_sizes`).

Both plans are capped by memory (`memory_bytes`, what one rank may use) and by time: a size whose
predicted round does not fit its share of the budget is left out, and the plan says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from labutils.core.inputs import LabInputError, check_int, check_number, check_range
from labutils.model.ddp_model import mlp_gradient_bytes
from labutils.model.fit import allreduce_ms

ROUND_TO = 32  # hidden sizes are multiples of 32: 4H splits evenly over up to 8 ranks (and 128 on a GPU)
# (warm-up rounds, least and most timed repetitions) per size of 09's layers, quick and full mode
LAYER_REPS = {True: (2, 5, 100), False: (5, 15, 400)}
# the same for each configuration of 10's steps (StepConfig's warmup, steps and max_steps)
DDP_REPS = {True: (2, 3, 50), False: (3, 10, 200)}


@dataclass(frozen=True)
class Rates:
    """What one rank's device does (`flops_per_s`, fp32 GEMM) and what the link carries between the
    ranks (`alpha_us`, `busbw_GBps`, decimal GB/s as nccl-tests), and the memory one rank may use."""

    flops_per_s: float
    alpha_us: float
    busbw_GBps: float
    memory_bytes: float

    def __post_init__(self):
        check_range("flops_per_s", self.flops_per_s, low=1e6, high=1e17, unit="flop/s")
        check_range("alpha_us", self.alpha_us, low=0, high=1e7, unit="us")
        check_range("busbw_GBps", self.busbw_GBps, low=1e-4, high=1e5, unit="GB/s")
        check_range("memory_bytes", self.memory_bytes, low=2**20, unit="bytes")


# --- notebook 07: the split MLP block ----------------------------------------------------------------

def block_flops(batch: int, hidden: int) -> float:
    """Both linears of the MLP block (H -> 4H -> H), 2 flops per multiply-add: 16 b H^2."""
    return 16.0 * batch * hidden * hidden


def block_volume_bytes(batch: int, hidden: int) -> float:
    """The split's all-reduce: the fp32 output of the second linear, 4 b H bytes."""
    return 4.0 * batch * hidden


def allreduce_s(volume_bytes: float, rates: Rates, nproc: int = 2) -> float:
    """alpha + 2(N-1)/N * V / busbw, in seconds: the lab's one all-reduce time (fit.allreduce_ms)."""
    return float(allreduce_ms(volume_bytes, nproc, rates.busbw_GBps, rates.alpha_us)) / 1e3


def break_even_hidden(batch: int, rates: Rates, nproc: int = 2) -> float:
    """H* where the split of a b-row block starts to pay at eta = 1:
    16 b H^2 / F * (1 - 1/N) = alpha + 2(N-1)/N * 4 b H / B, i.e. a H^2 - c H - alpha = 0."""
    a = 16.0 * batch / rates.flops_per_s * (1 - 1 / nproc)
    c = 2 * (nproc - 1) / nproc * 4.0 * batch / (rates.busbw_GBps * 1e9)
    alpha = rates.alpha_us * 1e-6
    return (c + math.sqrt(c * c + 4 * a * alpha)) / (2 * a)


def layer_batch(rates: Rates, nproc: int = 2) -> int:
    """The rows of 09's block: the smallest power of two from 8 whose break-even H* is at most 8 b
    (a layer neither a matrix-vector product nor a single row), at most 8192. On a CPU core
    against gloo that is tens of rows; a GPU, which needs far more work to cover the same
    latency, gets thousands."""
    batch = 8
    while batch < 8192 and break_even_hidden(batch, rates, nproc) > 8 * batch:
        batch *= 2
    return batch


def layer_memory_bytes(batch: int, hidden: int) -> float:
    """What one rank holds for the largest mode: the whole block's fp32 weights (2 x 4H^2), a
    shard of them, and a few b x 4H activations: about 48 H^2 + 64 b H bytes."""
    return 48.0 * hidden * hidden + 64.0 * batch * hidden


def round_up(x: float, multiple: int = ROUND_TO) -> int:
    return max(multiple, int(math.ceil(x / multiple)) * multiple)


@dataclass(frozen=True)
class LayerPlan:
    """09's sizes (06 uses `timing_size`): `batch` rows, `hidden_sizes` around the break-even
    `break_even_hidden` (H*), the overlap study's size and chunk counts, the sizes left out by the
    memory cap (`too_big`), and why."""

    batch: int
    hidden_sizes: tuple[int, ...]
    overlap_size: tuple[int, int]
    chunk_counts: tuple[int, ...]
    timing_size: tuple[int, int]
    break_even_hidden: float
    too_big: tuple[int, ...]
    why: str

    @property
    def sizes(self) -> list[tuple[int, int]]:
        return [(self.batch, h) for h in self.hidden_sizes]


def _check_quick(quick) -> bool:
    """The notebooks' `quick` parameter: True or False (numpy's too), nothing else."""
    if not isinstance(quick, (bool, np.bool_)):
        raise LabInputError(f"quick={quick!r} must be True or False")
    return bool(quick)


def layer_plan(rates: Rates, quick: bool, nproc: int = 2) -> LayerPlan:
    """Hidden sizes H* x 2^(k/2), k = -4..4 (quick: k = -4, -2, 0, 2, 4), rounded up to multiples of
    32, each fitting `rates.memory_bytes` (`layer_memory_bytes` at most a third of it)."""
    nproc = check_int("nproc", nproc, low=2, high=8)
    quick = _check_quick(quick)
    batch = layer_batch(rates, nproc)
    star = break_even_hidden(batch, rates, nproc)
    steps = range(-4, 5, 2) if quick else range(-4, 5)
    wanted = sorted({round_up(star * 2 ** (k / 2)) for k in steps})
    fits = [h for h in wanted if layer_memory_bytes(batch, h) <= rates.memory_bytes / 3]
    too_big = tuple(h for h in wanted if h not in fits)
    fits = fits or [ROUND_TO]
    overlap_hidden = min(fits, key=lambda h: abs(math.log(h / star)))
    timing_hidden = min(fits, key=lambda h: abs(math.log(h / (2 * star))))
    why = (f"{batch} rows: compute {rates.flops_per_s / 1e9:.3g} GFLOP/s per rank against alpha "
           f"{rates.alpha_us:.3g} us and busbw {rates.busbw_GBps:.3g} GB/s puts the break-even near hidden size "
           f"h* = {star:.0f} (eta = 1); h = {fits[0]}..{fits[-1]} spans it")
    if too_big:
        why += f" (hidden {', '.join(map(str, too_big))} left out: more than a third of the memory)"
    return LayerPlan(batch, tuple(fits), (batch, overlap_hidden), (1, 2, 4) if quick else (1, 2, 4, 8),
                     (batch, timing_hidden), star, too_big, why)


def compute_size(flops_per_s: float, target_ms: float = 2.0) -> tuple[int, int]:
    """A block whose whole-layer compute takes about `target_ms` on a device of `flops_per_s`, with
    rows a quarter of its hidden size (notebook 06's one timed step, before any link is known):
    16 b H^2 / F = t with b = H / 4, so H = (F t / 4)^(1/3); b a power of two, H a multiple of 32."""
    check_number("flops_per_s", flops_per_s, low=1e6, high=1e17, unit="flop/s")
    check_number("target_ms", target_ms, low=0, low_open=True, high=1e6, unit="ms")
    hidden = round_up((flops_per_s * target_ms * 1e-3 / 4) ** (1 / 3))
    return 2 ** max(3, round(math.log2(hidden / 4))), hidden


def layer_round_s(batch: int, hidden: int, modes: tuple[str, ...], rates: Rates, nproc: int = 2,
                  chunks: tuple[int, ...] = (1,)) -> float:
    """Predicted wall time of one interleaved round of `modes` at one size (seconds): each mode's
    compute (whole: C, a shard: C / N) plus, for the modes that communicate, its all-reduce and
    the untimed line-up step before it (another step of the same length)."""
    c = block_flops(batch, hidden) / rates.flops_per_s
    comm = allreduce_s(block_volume_bytes(batch, hidden), rates, nproc)
    barrier = rates.alpha_us * 1e-6
    per_mode = {"whole": c, "replica": c, "halves": c / nproc, "split": 2 * (c / nproc + comm)}
    total = 0.0
    for mode in modes:
        if mode == "overlap":
            total += sum(2 * (c / nproc + comm + k * barrier) for k in chunks)
        else:
            total += per_mode[mode]
        total += barrier
    return total


# --- notebook 08: data parallelism -------------------------------------------------------------------

def ddp_step_flops(width: int, depth: int, batch: int) -> float:
    """Forward (2 b w^2 per layer) and backward (twice that): 6 b w^2 d flops."""
    return 6.0 * batch * width * width * depth


def ddp_batch(rates: Rates, nproc: int = 2) -> int:
    """Per-rank rows that make compute equal the gradient all-reduce:
    6 b w^2 d / F = 2(N-1)/N * 4 w^2 d / B  =>  b = 4 F (N - 1) / (3 N B), as a power of two in [4, 65536]."""
    b = 4 * rates.flops_per_s * (nproc - 1) / (3 * nproc * rates.busbw_GBps * 1e9)
    return int(min(65536, max(4, 2 ** round(math.log2(max(b, 1.0))))))


BALANCE_ROWS = 64  # rows below which a training step waits on memory rather than on the multipliers


def step_flops_per_s(batch: int, rates: Rates) -> float:
    """The rate a training step of `batch` rows reaches: F x min(1, b / 64). A step reads and writes
    each weight about six times (forward, backward, gradient, optimizer) for 6 b flops, so b / 4
    flops per byte; CPUs and GPUs alike need about 16 flops per byte of memory traffic to keep
    their multipliers busy (a roofline), so below 64 rows the step slows in proportion."""
    return rates.flops_per_s * min(1.0, batch / BALANCE_ROWS)


def ddp_step_s(width: int, depth: int, batch: int, rates: Rates, nproc: int = 2) -> float:
    """A step with nothing hidden (seconds): compute at `step_flops_per_s` + alpha + 2(N-1)/N * G / B
    (no all-reduce for one rank)."""
    compute = ddp_step_flops(width, depth, batch) / step_flops_per_s(batch, rates)
    return compute + allreduce_s(mlp_gradient_bytes(width, depth), rates, nproc)  # 0 for one rank


@dataclass(frozen=True)
class DdpPlan:
    """10's sizes: `batch_per_rank`, `widths` (4 models, gradients a factor 4 apart), bucket caps
    and the predicted seconds of the widest model's step; `why` in one sentence."""

    batch_per_rank: int
    widths: tuple[int, ...]
    bucket_caps_mb: tuple[float, ...]
    widest_step_s: float
    why: str
    warmup: int = 3
    steps: int = 10
    max_steps: int = 200


def ddp_runs_s(widths, depth: int, batch: int, caps: int, rates: Rates, nproc: int = 2) -> float:
    """One round of every run notebook 10 makes (seconds): per width one rank at b and at N b, DDP and
    the no-overlap variant on N ranks; the widest model again at each of `caps` bucket caps. Each
    N-rank step follows an untimed one that lines the ranks up (timing.line_up), and a DDP run's
    round also makes its reference backward without sync (about one rank's step)."""
    one = {w: ddp_step_s(w, depth, batch, rates, 1) for w in widths}
    singles = sum(one[w] + ddp_step_s(w, depth, nproc * batch, rates, 1) for w in widths)
    many = sum(4 * ddp_step_s(w, depth, batch, rates, nproc) + one[w] for w in widths)
    widest = max(widths)
    return singles + many + caps * (2 * ddp_step_s(widest, depth, batch, rates, nproc) + one[widest])


def ddp_plan(rates: Rates, quick: bool, budget_s: float, depth: int = 4, nproc: int = 2) -> DdpPlan:
    """The batch from `ddp_batch`; 4 widths (quick: 2), each half the next (a quarter of the
    gradient), the widest as wide as lets every run's least steps and the contention probe fit
    half of `budget_s` (`ddp_runs_s` x (building + warm-up + 1 probe + least steps) + 15 steps of the widest; half,
    since the alpha-beta line is optimistic for gloo's large messages, which leave the caches);
    at least width 64, at most 16384, and activations and weights within a third of the memory."""
    budget_s = check_number("budget_s", budget_s, low=0, unit="s")  # 0: the narrowest models only
    quick = _check_quick(quick)
    depth, nproc = check_int("depth", depth, low=1, high=64), check_int("nproc", nproc, low=2, high=8)
    batch = ddp_batch(rates, nproc)
    count, ncaps = (2, 2) if quick else (4, 4)
    warmup, least, _ = DDP_REPS[bool(quick)]

    def widths_for(widest: int) -> tuple[int, ...]:
        return tuple(sorted({max(16, round_up(widest / 2 ** k, 16)) for k in range(count)}))

    width = 64
    while width < 16384:
        nxt = width * 2 if width < 1024 else width + 512
        # every run's least steps, warm-up and probe; then the contention probe, 5 x 3 steps of the widest
        cost = ((warmup + 2 + least) * ddp_runs_s(widths_for(nxt), depth, batch, ncaps, rates, nproc)
                + 15 * ddp_step_s(nxt, depth, batch, rates, nproc))
        memory = 4.0 * nxt * nxt * depth * 4 + 4.0 * nproc * batch * nxt * (depth + 2) * 3
        if cost > 0.5 * budget_s or memory > rates.memory_bytes / 3:
            break
        width = nxt
    widths = widths_for(width)
    gradient_mib = mlp_gradient_bytes(widths[-1], depth) / 2**20
    caps = tuple(c for c in (1.0, 4.0, 16.0, 64.0) if c < 2 * gradient_mib)[:ncaps] or (1.0,)
    step = ddp_step_s(widths[-1], depth, batch, rates, nproc)
    why = (f"{batch} rows per rank make compute ({rates.flops_per_s / 1e9:.3g} GFLOP/s) and the all-reduce "
           f"({rates.busbw_GBps:.3g} GB/s) of the same order; widths up to {widths[-1]} fill the budget")
    return DdpPlan(batch, widths, caps, step, why, *DDP_REPS[bool(quick)])


# --- how many repetitions fit a share of the budget --------------------------------------------------

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
