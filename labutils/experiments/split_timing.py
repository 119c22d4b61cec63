"""Timing the split layer on ranks (notebooks 06 and 09): the experiment whose rows
labutils.experiments.validation holds the time budget against.

Reading order:
1. the steps one rank times: the whole layer ("whole", rank 0 alone: T1), the split with one
   all-reduce ("split": T2), the split's halves with no communication ("halves": the compute-only
   run that gives an eta *before* the split is measured), a replica of the whole layer per rank
   ("replica") and the split with the batch in chunks overlapping their all-reduces ("overlap");
2. timing them interleaved repetition by repetition, so that load elsewhere on the machine hits
   them alike (`time_layers` runs `time_layers_worker` on the kernel's rank pool,
   labutils.measure.pool.shared_pool; one row per size, mode, chunk count and rank). The sizes
   come from the machine (labutils.model.sizing.layer_plan), the repetitions from a time budget.

What one "device" is (notebook 09, section 1): on a CPU-only machine a core. Each rank of the split
gets `threads_per_rank` threads (labutils.measure.launch.default_threads(2): the cores shared out so
the two ranks do not fight over them), and the one-rank baseline T1 gets the same count. Giving T1
all the cores would compare two devices with two devices, and eta would measure thread scaling
inside one process instead of the split. On a GPU a device is a GPU; with one GPU the two ranks
share it, the all-reduce goes through host memory (gloo), and the halves take turns on the SMs, so
eta falls toward 0.5: it emulates two devices and a link, never a second GPU computing its half at
the same time.

The protocol of the source article's test: the layer fixed per size, warm-up steps untimed (one
untimed round, then one untimed step before each communicating repetition), the time of the work
itself, not of its launch (tensor_parallel.timed_step: CUDA events on a GPU), compute, communication
and serial part timed apart (SectionTimer), every figure a median over repetitions, T2 each
repetition's slowest rank. "whole" runs on rank 0 alone while rank 1 waits idle in a barrier.

The model side (inputs, predictions, break-even, tables) is labutils.experiments.validation; it reads the
rows and never starts a process.
"""

from __future__ import annotations

import time
from dataclasses import astuple

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from labutils.core.inputs import check_choice, check_int, check_range
from labutils.experiments.tensor_parallel import (
    LayerSize,
    MLPWeights,
    as_size,
    dist_all_reduce,
    dist_world_size,
    median_times,
    mlp_input,
    mlp_partial,
    mlp_weights,
    serial_tail,
    shard,
    timed_step,
    tp_block_step,
    weights_checksum,
)
from labutils.measure.pool import rank_progress, shared_pool
from labutils.measure.timeline import Timeline, profile_step, record_timeline
from labutils.measure.timing import SectionTimer, across_ranks, agree_reps, barrier, line_up, round_s
from labutils.model.sizing import LAYER_REPS, Reps, dropped_sentence, fit_sizes, plan_reps, share_budget
from labutils.model.toy_split import split_columns

# --- 1. the steps one rank times ------------------------------------------------------------------------

LAYER_MODES = ("whole", "split", "halves", "replica", "overlap")


def overlap_step(x, w: MLPWeights, activation: str, chunks: int, timer):
    """The split step with the batch cut into `chunks`: the all-reduce of chunk i runs (async)
    while chunk i+1 computes; the waits at the end are the communication left exposed.
    """
    pieces, handles = [], []
    for xs in torch.chunk(x, chunks, dim=0):
        with timer.section("compute"):
            y = mlp_partial(xs, w, activation)
        pieces.append(y)
        with timer.section("communication"):  # issuing the all-reduce costs the caller time too
            if dist_world_size() > 1:
                handles.append(dist_all_reduce(y, async_op=True))
    with timer.section("communication"):
        for h in handles:
            h.wait()
    with timer.section("serial"):
        return serial_tail(x, torch.cat(pieces, dim=0), w.b2)


# --- 2. timing them interleaved ----------------------------------------------------------------------

def _time_one_repetition(ctx, mode: str, step):
    """One aligned repetition of `step`: StepTimes on the ranks taking part, None elsewhere.

    "whole" runs on rank 0 alone while the other ranks wait, idle, in the closing barrier.
    Modes that communicate start after one untimed step (timing.line_up); the others after a barrier.
    """
    communicates = mode in ("split", "overlap")
    line_up(ctx.device, (lambda: timed_step(step, ctx.device)) if communicates else None)
    times = timed_step(step, ctx.device)[1] if mode != "whole" or ctx.rank == 0 else None
    if mode == "whole":
        barrier(ctx.device)
    return times


def _one_round(ctx, steps: dict) -> dict:
    """One repetition of every variant in `steps`, in turn: {variant: StepTimes or None}."""
    return {v: _time_one_repetition(ctx, v[0], step) for v, step in steps.items()}


def _time_interleaved(ctx, steps: dict, reps: int) -> dict:
    """Time every variant in `steps` ({(mode, chunks): step}) in turn, `reps` repetitions.

    Interleaving pairs the samples in time: a burst of load elsewhere on the machine hits the
    one-rank and the split runs alike. One untimed round first (the sizes before this one ran
    since its warm-up). Returns {variant: (this rank's StepTimes list, [step_ms, compute_slowest_ms]
    per repetition)}, where step_ms is the slowest rank's total and compute_slowest_ms the slowest
    rank's compute (all-reduce MAX; for "whole", rank 0's own), or {} on ranks that did not take part.
    """
    _one_round(ctx, steps)
    samples = {v: [] for v in steps}
    for _ in range(reps):
        for v, t in _one_round(ctx, steps).items():
            samples[v].append(t)
    out = {}
    for v, times in samples.items():
        if v[0] == "whole" and ctx.rank != 0:
            continue
        slowest = torch.tensor([[t.total_ms for t in times], [t.compute_ms for t in times]],
                               dtype=torch.float64, device=ctx.device)
        if v[0] != "whole" and dist_world_size() > 1:
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out[v] = (times, slowest.cpu().tolist())
    return out


def _size_steps(ctx, size: LayerSize, variants, seed: int, dtype: str, activation: str) -> dict:
    """The steps of every variant for one size, on weights every rank holds alike (checked: the
    checksum's max and min over ranks agree, one small all-reduce each)."""
    full = mlp_weights(size.hidden, size.ffn, seed, dtype, ctx.device)
    spread = across_ranks(weights_checksum(full), ctx.device)
    if spread.max != spread.min:
        raise RuntimeError(f"ranks drew different weights for {size} (checksums {spread.min!r}..{spread.max!r})")
    part = shard(full, ctx.rank, ctx.world_size)
    return {v: _step_for(ctx, full, part, size, *v, seed, dtype, activation) for v in variants}


def _step_for(ctx, full: MLPWeights, part: MLPWeights, size: LayerSize, mode: str, chunks: int, seed: int,
              dtype: str, activation: str):
    """The step function one rank times for `mode` (see time_layers_worker)."""
    alone = mode in ("whole", "replica")
    w = full if alone else part
    x = mlp_input(size.batch, size.hidden, seed + (ctx.rank if mode == "replica" else 0), dtype, ctx.device)
    if mode == "overlap":
        return lambda timer: overlap_step(x, w, activation, chunks, timer)
    return lambda timer: tp_block_step(x, w, activation, timer, reduce=mode == "split")


def time_layers_worker(ctx, sizes, modes=("whole", "split"), chunks=(1,), seed: int = 0, dtype: str = "float32",
                       activation: str = "relu", warmup: int = 3, min_reps: int = 5, max_reps: int = 200,
                       budget_s: float = 1.0) -> dict:
    """For every size, time all modes interleaved repetition by repetition (see `_time_interleaved`).

    "whole": rank 0 alone runs the whole layer while the other ranks wait in a barrier (T1);
    "split": every rank its shard and one all-reduce (T2);
    "halves": every rank its shard and no all-reduce (the split's compute alone, for eta);
    "replica": every rank the whole layer on its own input, no communication (two replicas);
    "overlap": the split with k in `chunks` asynchronous all-reduces overlapping the compute.

    Repetitions from the budget, which counts from the call's start (building, warm-up and the
    probes come out of it): per size, `warmup` rounds, then ONE round timed on the wall clock
    (timing.round_s: everything a repetition does); rank 0 drops the largest sizes (in flops) when
    `min_reps` rounds of all do not fit `budget_s` (sizing.fit_sizes), shares the budget over
    the rest (sizing.share_budget), picks each size's count (sizing.plan_reps) and
    broadcasts them (timing.agree_reps).
    Returns {"rows", "round_s", "dropped"}: one row per (size, mode, k) and rank taking part: the
    rank's median serial / compute / communication / total, `step_ms`, the median over repetitions
    of the slowest rank's total (what the step took), `compute_slowest_ms`, the same for the compute
    part (each step waits for the slower half), `reps` and `budget_cut`; `round_s` per size (rank
    0's) and the dropped sizes as (batch, hidden, ffn).
    """
    for mode in modes:
        check_choice("mode", mode, LAYER_MODES)
    variants = [(mode, int(k)) for mode in modes for k in (chunks if mode == "overlap" else (1,))]
    sizes = [as_size(raw) for raw in sizes]
    rounds, start = [], time.perf_counter()
    for size in sizes:
        steps = _size_steps(ctx, size, variants, seed, dtype, activation)
        for _ in range(warmup):
            _one_round(ctx, steps)
        rounds.append(round_s(lambda: _one_round(ctx, steps), ctx.device))  # noqa: B023 (called right here)
        del steps
    # The budget covers the whole call: what building, warm-up and the probes took comes out of it,
    # and so does one untimed round per kept size (rank 0's clock decides; agree_reps broadcasts).
    left_s = max(0.0, budget_s - (time.perf_counter() - start))
    by_size = sorted(range(len(sizes)), key=lambda i: sizes[i].flops)  # fit_sizes drops the largest first
    kept = [by_size[k] for k in fit_sizes([rounds[i] for i in by_size], left_s, min_reps + 1)[0]]
    left_s = max(0.0, left_s - sum(rounds[i] for i in kept))
    shares = dict(zip(kept, share_budget([rounds[i] for i in kept], left_s, min_reps, max_reps)))
    plans = agree_reps([plan_reps(rounds[i], shares[i], min_reps, max_reps) if i in shares else Reps(0, True, False)
                        for i in range(len(sizes))], ctx.device)
    rows, dropped = [], []
    for i, (size, plan) in enumerate(zip(sizes, plans)):
        if plan.reps == 0:
            dropped.append(astuple(size))
            ctx.report({"done": i + 1, "of": len(sizes)})
            continue
        steps = _size_steps(ctx, size, variants, seed, dtype, activation)
        for (mode, k), (samples, (step_ms, compute_ms)) in _time_interleaved(ctx, steps, plan.reps).items():
            rows.append({"rank": ctx.rank, "ranks": 1 if mode == "whole" else ctx.world_size, "mode": mode,
                         "chunks": k, "batch": size.batch, "hidden": size.hidden, "ffn": size.ffn, "dtype": dtype,
                         "reps": len(samples), "budget_cut": plan.budget_cut, **median_times(samples),
                         "step_ms": float(np.median(step_ms)), "step_p90_ms": float(np.percentile(step_ms, 90)),
                         "compute_slowest_ms": float(np.median(compute_ms))})
        ctx.report({"done": i + 1, "of": len(sizes)})
    return {"rows": rows, "round_s": rounds, "dropped": dropped}


def layer_frame(per_rank: list[dict], budget_s: float, min_reps: int) -> pd.DataFrame:
    """The rows of every rank as one frame; `attrs` holds the budget, the sizes it dropped
    ("dropped_sizes", (batch, hidden, ffn) each), rank 0's round per size and the sentence saying so."""
    frame = pd.DataFrame([row for out in per_rank for row in out["rows"]])
    dropped = [tuple(d) for d in per_rank[0]["dropped"]]
    frame.attrs.update(budget_s=budget_s, dropped_sizes=dropped, round_s=list(per_rank[0]["round_s"]),
                       budget_note=dropped_sentence(dropped, float(f"{budget_s:.3g}"), min_reps))  # as read: 11.4 s
    return frame


def budget_note(frame: pd.DataFrame) -> str:
    """The sentence the notebook prints after `time_layers`: which sizes, if any, the budget left out."""
    return frame.attrs.get("budget_note", "")


def time_layers(sizes, nproc: int = 2, modes=("whole", "split"), *, backend: str = "gloo", device: str = "cpu",
                threads_per_rank: int | None = None, chunks=(1,), quick: bool = True, seed: int = 0,
                dtype: str = "float32", progress: bool = False, timeout_s: float = 600.0,
                budget_s: float | None = None) -> pd.DataFrame:
    """Launch `time_layers_worker` on `nproc` ranks; one row per (size, mode, chunks, rank).

    `modes` from LAYER_MODES (see time_layers_worker): ("whole", "halves") is the run notebook 09
    predicts from, before ("whole", "split") is measured.

    CPU placement is the launcher's plan for `nproc` ranks (labutils.measure.placement), with
    `threads_per_rank` threads when given. "whole" runs on rank 0 of the same launch, so the
    one-rank baseline has the CPUs and threads of one rank of the split: "one device" is the same
    on both sides.
    budget_s: seconds this call may spend on the ranks, all sizes together, building, warm-up and
    the probe round of each size included; default 0.3 s per size with `quick`, else 2 s per size.
    quick: 2 warm-up rounds and 5..100 repetitions per size; else 5 and 15..400. Each row carries
    its `reps` and `budget_cut`; sizes the budget could not fit are in frame.attrs["dropped_sizes"]
    (`budget_note(frame)` says so in a sentence).
    """
    nproc = check_int("nproc", nproc, low=1)
    for s in sizes:
        split_columns(as_size(s).ffn, nproc, "nproc")  # refuse here, not in every rank
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    for mode in modes:
        check_choice("mode", mode, LAYER_MODES)
    chunks = tuple(check_int("chunks", k, low=1) for k in np.atleast_1d(chunks).tolist())
    if budget_s is None:
        budget_s = (0.3 if quick else 2.0) * len(sizes)
    check_range("budget_s", budget_s, low=0, unit="s")  # 0: only the least repetitions
    warmup, min_reps, max_reps = LAYER_REPS[bool(quick)]
    kwargs = {"sizes": [astuple(as_size(s)) for s in sizes], "modes": modes, "chunks": chunks, "seed": seed,
              "dtype": dtype, "warmup": warmup, "min_reps": min_reps,
              "max_reps": max_reps, "budget_s": float(budget_s)}
    with rank_progress(len(sizes), f"{'+'.join(modes)} on {nproc} rank(s)", progress, unit="size",
                       leave=True) as on_report:
        per_rank = shared_pool(nproc, backend, device, threads_per_rank).run(
            time_layers_worker, kwargs=kwargs, timeout_s=timeout_s, on_report=on_report)
    return layer_frame(per_rank, float(budget_s), min_reps)


def overlap_timeline_worker(ctx, size=(32, 256), chunks: int = 4, warmup: int = 2, seed: int = 0,
                        activation: str = "relu") -> dict:
    """One step of notebook 09's chunked split layer (overlap_step) recorded on
    this rank: chunk i's all-reduce is started asynchronously while chunk i+1 computes."""
    size = as_size(size)
    part = shard(mlp_weights(size.hidden, size.ffn, seed, "float32", ctx.device), ctx.rank, ctx.world_size)
    x = mlp_input(size.batch, size.hidden, seed, "float32", ctx.device)
    trace = profile_step(lambda: overlap_step(x, part, activation, chunks, SectionTimer(ctx.device)), ctx.device,
                         warmup)
    return {"rank": ctx.rank, "trace": trace}


def record_overlap_step(size=(32, 256), chunks: int = 4, nproc: int = 2, backend: str = "gloo", device: str = "cpu",
                        warmup: int = 2, timeout_s: float = 120.0) -> Timeline:
    """Record one chunked split-layer step (notebook 09's overlap) on `nproc` ranks."""
    size = as_size(size)
    chunks = check_int("chunks", chunks, low=1, high=size.batch)
    split_columns(size.ffn, nproc, "nproc")
    kwargs = {"size": (size.batch, size.hidden, size.ffn), "chunks": chunks, "warmup": warmup}
    return record_timeline(overlap_timeline_worker, nproc, kwargs, backend, device, timeout_s,
                   f"one split-layer step {size.batch}x{size.hidden} in {chunks} chunks, {nproc} ranks "
                   f"({backend} on {device})")
