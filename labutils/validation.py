"""The two-device budget held against a measured split layer (notebook 07).

Reading order:
1. timing the split: every rank times whole / split / replica / overlap steps of the MLP block
   (labutils.tensor_parallel), interleaved repetition by repetition so that load elsewhere on
   the machine hits them alike; `measure` launches it, `per_size` collapses the ranks;
2. the budget's inputs from those timings: S and C from T1 (one rank, whole layer), eta from
   the split's compute on the slower rank, Q = 1 all-reduce of V = output bytes, latency and
   bandwidth from the measured link (labutils.my_link), never from the same timings;
3. predicted against measured: T2 per size (`validation_table`), the break-even size, overlap
   of chunked all-reduces with compute, two replicas against one split layer, the hand-in
   summary, and the exercise checker.

Workers (functions a spawned rank runs) live here and are started with `labutils.launch.launch`.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

import numpy as np
import pandas as pd

from labutils import budget
from labutils.harness import agree_iters
from labutils.inputs import LabInputError, check_choice, check_int
from labutils.launch import launch
from labutils.progress import rank_progress
from labutils.tensor_parallel import (
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
    split_columns,
    timed_step,
    tp_block_step,
)
from labutils.timing import barrier, line_up

# --- 0. the sizes, a pure function of the route ------------------------------------------------------

CPU_HIDDEN = (64, 96, 128, 192, 256, 384, 512, 768, 1024)
GPU_HIDDEN = (256, 512, 1024, 2048, 4096, 6144)


@dataclass(frozen=True)
class LayerPlan:
    """The layer sizes of notebooks 05 and 07: `batch` rows, `hidden_sizes` for the sweep, the size
    of the overlap study, its chunk counts, 05's one timed size, and why they suit the route."""

    batch: int
    hidden_sizes: tuple[int, ...]
    overlap_size: tuple[int, int]
    chunk_counts: tuple[int, ...]
    timing_size: tuple[int, int]
    why: str

    @property
    def sizes(self) -> list[tuple[int, int]]:
        return [(self.batch, h) for h in self.hidden_sizes]


def layer_plan(route, quick: bool) -> LayerPlan:
    """The sizes for `route` (a machine.Route; only whether it computes on a GPU matters).

    The block's work is 16 b H^2 flops (both linears, ffn = 4H), its all-reduce moves 4 b H bytes.
    On a CPU core (~1e10 flop/s) hidden 64..1024 at b = 32 spans ~0.02 to ~5 ms of compute against
    gloo's fraction of a millisecond: the break-even falls inside. A GPU does ~6.7e13 fp32 flop/s,
    so the same sizes take microseconds; b = 512 and hidden 256..6144 span ~10 us to ~5 ms, which
    crosses NCCL's break-even, and on ranks sharing one GPU (eta near 0.5) shows the budget's
    "never" with its numbers.
    """
    if getattr(route, "on_gpu", False):
        hidden = (512, 2048, 4096) if quick else GPU_HIDDEN
        return LayerPlan(512, hidden, (512, 4096), (1, 2, 4) if quick else (1, 2, 4, 8), (512, 4096),
                         "GPU: 512 rows and hidden up to 6144, so compute reaches milliseconds")
    hidden = tuple(sorted(set(CPU_HIDDEN[::2]) | set(CPU_HIDDEN[1::4]))) if quick else CPU_HIDDEN
    return LayerPlan(32, hidden, (64, 512), (1, 2, 4) if quick else (1, 2, 4, 8), (32, 512),
                     "CPU: 32 rows and hidden up to 1024, compute from microseconds to milliseconds per core")


# --- 1. timing the split on ranks -------------------------------------------------------------------

def overlap_step(x, w: MLPWeights, activation: str, chunks: int, timer):
    """The split step with the batch cut into `chunks`: the all-reduce of chunk i runs (async)
    while chunk i+1 computes; the waits at the end are the communication left exposed.
    """
    import torch

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


def _once(ctx, mode: str, step):
    """One aligned repetition of `step`: StepTimes on the ranks taking part, None elsewhere.

    "whole" runs on rank 0 alone while the other ranks wait, idle, in the closing barrier.
    Modes that communicate start after one untimed step (timing.line_up).
    """

    communicates = mode in ("split", "overlap")
    line_up(ctx.device, (lambda: timed_step(step, ctx.device)) if communicates else None)
    times = timed_step(step, ctx.device)[1] if mode != "whole" or ctx.rank == 0 else None
    if mode == "whole":
        barrier(ctx.device)
    return times


def _repeat(ctx, steps: dict, warmup: int, min_reps: int, max_reps: int, target_ms: float) -> dict:
    """Time every variant in `steps` ({(mode, chunks): step}) in turn, repetition by repetition.

    Interleaving pairs the samples in time: a burst of load elsewhere on the machine hits the
    one-rank and the split runs alike. Warm-up is not timed; rank 0 turns its warm-up into a
    repetition count (about `target_ms` for all variants together) and broadcasts it.
    Returns {variant: (this rank's StepTimes list, [step_ms, compute_slowest_ms] per repetition)},
    where step_ms is the slowest rank's total and compute_slowest_ms the slowest rank's compute
    (all-reduce MAX; for "whole", rank 0's own), or {} on ranks that did not take part.
    """
    import torch
    import torch.distributed as dist

    warm = {v: [] for v in steps}
    for _ in range(warmup):
        for v, step in steps.items():
            t = _once(ctx, v[0], step)
            warm[v].append(t.total_ms if t else 0.0)
    probe_ms = sum(float(np.median(w)) for w in warm.values()) if warmup else 0.0
    reps = agree_iters(probe_ms, target_ms, min_reps, max_reps, ctx.device)
    samples = {v: [] for v in steps}
    for _ in range(reps):
        for v, step in steps.items():
            samples[v].append(_once(ctx, v[0], step))
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


MODES = ("whole", "split", "replica", "overlap")


def _step_for(ctx, full: MLPWeights, part: MLPWeights, size: LayerSize, mode: str, chunks: int, seed: int,
              dtype: str, activation: str):
    """The step function one rank times for `mode` (see measure_worker)."""
    alone = mode in ("whole", "replica")
    w = full if alone else part
    x = mlp_input(size.batch, size.hidden, seed + (ctx.rank if mode == "replica" else 0), dtype, ctx.device)
    if mode == "overlap":
        return lambda timer: overlap_step(x, w, activation, chunks, timer)
    return lambda timer: tp_block_step(x, w, activation, timer, reduce=not alone)


def measure_worker(ctx, sizes, modes=("whole", "split"), chunks=(1,), seed: int = 0, dtype: str = "float32",
                   activation: str = "relu", warmup: int = 3, min_reps: int = 5, max_reps: int = 200,
                   target_ms: float = 200.0) -> list[dict]:
    """For every size, time all modes interleaved repetition by repetition (see `_repeat`).

    "whole": rank 0 alone runs the whole layer while the other ranks wait in a barrier (T1);
    "split": every rank its shard and one all-reduce (T2);
    "replica": every rank the whole layer on its own input, no communication (two replicas);
    "overlap": the split with k in `chunks` asynchronous all-reduces overlapping the compute.
    One dict per (size, mode, k) and rank taking part: the rank's median serial / compute /
    communication / total, `step_ms`, the median over repetitions of the slowest rank's total
    (what the step took), and `compute_slowest_ms`, the same for the compute part (each step
    waits for the slower half).
    """
    for mode in modes:
        check_choice("mode", mode, MODES)
    variants = [(mode, int(k)) for mode in modes for k in (chunks if mode == "overlap" else (1,))]
    rows = []
    for i, raw in enumerate(sizes):
        size = as_size(raw)
        full = mlp_weights(size.hidden, size.ffn, seed, dtype, ctx.device)
        part = shard(full, ctx.rank, ctx.world_size)
        steps = {v: _step_for(ctx, full, part, size, *v, seed, dtype, activation) for v in variants}
        for (mode, k), (samples, (step_ms, compute_ms)) in _repeat(ctx, steps, warmup, min_reps, max_reps,
                                                                   target_ms).items():
            rows.append({"rank": ctx.rank, "ranks": 1 if mode == "whole" else ctx.world_size, "mode": mode,
                         "chunks": k, "batch": size.batch, "hidden": size.hidden, "ffn": size.ffn, "dtype": dtype,
                         "reps": len(samples), **median_times(samples), "step_ms": float(np.median(step_ms)),
                         "step_p90_ms": float(np.percentile(step_ms, 90)),
                         "compute_slowest_ms": float(np.median(compute_ms))})
        ctx.report({"done": i + 1, "of": len(sizes)})
    return rows


def measure(sizes, nproc: int = 2, modes=("whole", "split"), *, backend: str = "gloo", device: str = "cpu",
            threads_per_rank: int | None = None, chunks=(1,), quick: bool = True, seed: int = 0,
            dtype: str = "float32", progress: bool = False, timeout_s: float = 600.0) -> pd.DataFrame:
    """Launch `measure_worker` on `nproc` ranks; one row per (size, mode, chunks, rank).

    CPU placement is the launcher's plan for `nproc` ranks (labutils.placement), with
    `threads_per_rank` threads when given. "whole" runs on rank 0 of the same launch, so the
    one-rank baseline has the CPUs and threads of one rank of the split: "one device" is the same
    on both sides.
    quick: 2 warm-up rounds and about 300 ms of repetitions (5..100) per size; else 5 and 2 s (15..400).
    """

    nproc = check_int("nproc", nproc, low=1)
    for s in sizes:
        split_columns(as_size(s).ffn, nproc, "nproc")  # refuse here, not in every rank
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    chunks = tuple(check_int("chunks", k, low=1) for k in np.atleast_1d(chunks).tolist())
    kwargs = {"sizes": [astuple(as_size(s)) for s in sizes], "modes": modes, "chunks": chunks, "seed": seed,
              "dtype": dtype, "warmup": 2 if quick else 5, "min_reps": 5 if quick else 15,
              "max_reps": 100 if quick else 400, "target_ms": 300.0 if quick else 2000.0}
    with rank_progress(len(sizes), f"{'+'.join(modes)} on {nproc} rank(s)", progress, unit="size",
                       leave=True) as on_report:
        per_rank = launch(measure_worker, nproc, kwargs=kwargs, backend=backend, device=device, timeout_s=timeout_s,
                          threads_per_rank=threads_per_rank, on_report=on_report)
    return pd.DataFrame([row for rows in per_rank for row in rows])


def per_size(frame: pd.DataFrame, mode: str | None = None) -> pd.DataFrame:
    """Collapse ranks (rows of `mode` only, when given): the slowest rank's median parts (max over
    ranks) and the step time, per (size, mode, chunks)."""
    if mode is not None:
        frame = frame[frame["mode"] == mode]
        if frame.empty:
            raise LabInputError(f"the measurements hold no rows of mode {mode!r}")
    keys = ["batch", "hidden", "ffn", "dtype", "mode", "chunks", "ranks"]
    agg = {c: "max" for c in ("serial_ms", "compute_ms", "communication_ms", "total_ms", "gap_ms")}
    agg.update(step_ms="first", step_p90_ms="first", reps="first", compute_slowest_ms="first")
    return frame.groupby(keys, as_index=False).agg(agg)


# --- 2. the budget's inputs from the timings ---------------------------------------------------

@dataclass(frozen=True)
class BudgetInputs:
    """The budget's parameters for one layer size, from measurements and the measured link.

    S_ms, C_ms: serial and compute of the one-rank run (T1 = S + C); eta = C / (2 C_rank) with
    C_rank the split's compute on the slower rank of each step (median over steps), capped at 1
    as the budget requires
    (`eta_measured` keeps the uncapped value: above 1 when a half runs better than half the
    whole, e.g. because its weights fit in cache); Q all-reduces of `volume_bytes` each (the
    output, batch x hidden x element bytes); latency_ms and bandwidth_GBps from the link fit.
    """

    S_ms: float
    C_ms: float
    eta: float
    Q: int
    volume_bytes: float
    latency_ms: float
    bandwidth_GBps: float
    eta_measured: float = math.nan

    def as_args(self) -> tuple:
        """Positional arguments of labutils.budget.t_two_ms / evaluate / overlap_bound_ms."""
        return (self.S_ms, self.C_ms, self.eta, self.Q, self.latency_ms, self.volume_bytes, self.bandwidth_GBps)


def estimate_inputs(t1, t2, link, volume_bytes: float, Q: int = 1) -> BudgetInputs:
    """Budget inputs from a one-rank row `t1` and a two-rank split row `t2` (per_size rows or dicts).

    S = t1 serial, C = t1 compute, eta = C / (2 * C_rank) capped at 1, where C_rank is t2's
    `compute_slowest_ms` (or `compute_ms` when absent); latency and bandwidth
    from `link` (a fit.LinkFit, translated by its `budget_params`). For 2 ranks the ring factor 2(N-1)/N
    is 1, so V / busbw is exactly the all-reduce's bandwidth term.
    """
    c_rank = float(t2["compute_slowest_ms"] if "compute_slowest_ms" in t2 else t2["compute_ms"])
    eta = math.inf if c_rank <= 0 else float(t1["compute_ms"]) / (2 * c_rank)
    params = link.budget_params()
    return BudgetInputs(float(t1["serial_ms"]), float(t1["compute_ms"]), min(eta, 1.0), int(Q), float(volume_bytes),
                        float(params["latency_ms"]), float(params["bandwidth_GBps"]), eta)


def _pairs(frame: pd.DataFrame, mode: str):
    """(one-rank row, two-rank row of `mode`, LayerSize) for every size measured in both modes."""
    one, two = per_size(frame, "whole"), per_size(frame, mode)
    if (two["ranks"] != 2).any():
        raise LabInputError(f"the budget compares one device with two; these {mode} rows ran on "
                            f"{sorted(two['ranks'].unique())} ranks")
    for _, r2 in two.iterrows():
        match = one[(one.batch == r2.batch) & (one.hidden == r2.hidden) & (one.ffn == r2.ffn)]
        if match.empty:
            raise LabInputError(f"no one-rank measurement for size {r2.batch}x{r2.hidden}")
        yield match.iloc[0], r2, LayerSize(int(r2.batch), int(r2.hidden), int(r2.ffn))


# --- 3. predicted against measured ----------------------------------------------------------------

def validation_table(frame: pd.DataFrame, link) -> pd.DataFrame:
    """Per size: estimate the inputs from the "whole" and "split" rows, predict T2 with
    labutils.budget, and compare with the measured T2.

    Columns: batch, hidden, work_flops, volume_bytes, S_ms, C_ms, C_rank_ms, eta (capped),
    eta_measured, T1_ms, T2_ms (measured), comm_ms (measured, slowest rank), comm_pred_ms,
    T2_pred_ms, rel_error = (predicted - measured) / measured, speedup, speedup_pred (T1 / T2).
    """

    rows = []
    for r1, r2, size in _pairs(frame, "split"):
        v = size.output_bytes(r2["dtype"])
        inp = estimate_inputs(r1, r2, link, v)
        t1_ms, t2_ms = float(r1.step_ms), float(r2.step_ms)
        pred = float(budget.t_two_ms(*inp.as_args()))
        rows.append({"batch": size.batch, "hidden": size.hidden, "work_flops": size.flops, "volume_bytes": v,
                     "S_ms": inp.S_ms, "C_ms": inp.C_ms, "C_rank_ms": inp.C_ms / (2 * inp.eta_measured),
                     "eta": inp.eta,
                     "eta_measured": inp.eta_measured, "T1_ms": t1_ms, "T2_ms": t2_ms,
                     "comm_ms": float(r2.communication_ms),
                     "comm_pred_ms": float(budget.comm_ms(inp.Q, inp.latency_ms, v, inp.bandwidth_GBps)),
                     "T2_pred_ms": pred, "rel_error": (pred - t2_ms) / t2_ms,
                     "speedup": t1_ms / t2_ms, "speedup_pred": t1_ms / pred})
    return pd.DataFrame(rows).sort_values("work_flops").reset_index(drop=True)


def budget_inputs_for(frame: pd.DataFrame, link, batch: int, hidden: int) -> BudgetInputs:
    """The estimated inputs of one measured size (for the exercise and for reading one row)."""
    for r1, r2, size in _pairs(frame, "split"):
        if (size.batch, size.hidden) == (batch, hidden):
            return estimate_inputs(r1, r2, link, size.output_bytes(r2["dtype"]))
    raise LabInputError(f"size {batch}x{hidden} was not measured in both modes")


@dataclass(frozen=True)
class BreakEven:
    """Where the split starts to win: layer work (flops) and one-rank compute C (ms) at T2 = T1.

    NaN values with a `reason` when the curves do not cross inside the measured range
    (math.inf when the split never wins there, 0 when it already wins at the smallest size).
    """

    work_flops: float
    C_ms: float
    reason: str = ""


def _log_interp(x0, x1, f0, f1):
    """x where the line through (log x0, f0), (log x1, f1) reaches f = 0."""
    t = f0 / (f0 - f1)
    return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0)))


def break_even(table: pd.DataFrame, t2_column: str = "T2_ms") -> BreakEven:
    """The size where T2 (measured, or "T2_pred_ms") falls below T1: the last crossing from
    slower to faster along the work axis, interpolated in log(T2 / T1) against log(work)."""
    rows = table.sort_values("work_flops")
    work = rows["work_flops"].to_numpy(float)
    c = rows["C_ms"].to_numpy(float)
    f = np.log(rows[t2_column].to_numpy(float) / rows["T1_ms"].to_numpy(float))
    if len(f) == 0:
        return BreakEven(math.nan, math.nan, "no measurements")
    if np.all(f > 0):
        return BreakEven(math.inf, math.inf, "the split is slower at every size measured: never in this range")
    if np.all(f <= 0):
        return BreakEven(0.0, 0.0, "the split already wins at the smallest size measured")
    for i in range(len(f) - 2, -1, -1):
        if f[i] > 0 >= f[i + 1]:
            return BreakEven(_log_interp(work[i], work[i + 1], f[i], f[i + 1]),
                             _log_interp(c[i], c[i + 1], f[i], f[i + 1]) if c[i] > 0 and c[i + 1] > 0 else math.nan)
    return BreakEven(math.inf, math.inf, "the split wins only at small sizes here: no crossing to a lasting win")


def overlap_table(frame: pd.DataFrame, link) -> pd.DataFrame:
    """Chunked split steps ("overlap" rows) against the no-overlap prediction and the overlap bound.

    For k chunks: Q = k all-reduces of V/k bytes; no overlap: S + C/(2 eta) + k(l + V/(k B));
    bound: S + max(C/(2 eta), k(l + V/(k B))). eta comes from the k = 1 run (nothing to overlap).
    """

    pairs = sorted(_pairs(frame, "overlap"), key=lambda p: int(p[1].chunks))
    if not pairs or int(pairs[0][1].chunks) != 1:
        raise LabInputError("the overlap runs need chunks=1 among them (the run with nothing to overlap)")
    one, base, size = pairs[0]
    v = size.output_bytes(base["dtype"])
    rows = []
    for _, r, _ in pairs:
        q = int(r.chunks)
        inp = estimate_inputs(one, base, link, v / q, Q=q)
        rows.append({"chunks": q, "measured_ms": float(r.step_ms), "compute_ms": float(r.compute_ms),
                     "exposed_comm_ms": float(r.communication_ms),
                     "no_overlap_ms": float(budget.t_two_ms(*inp.as_args())),
                     "overlap_bound_ms": float(budget.overlap_bound_ms(*inp.as_args())), "T1_ms": float(one.step_ms)})
    return pd.DataFrame(rows)


def replicas_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Same two devices, two goals: the latency of one batch against rows finished per second.

    "one device": the whole layer alone; "two replicas": each rank the whole layer on its own
    batch (twice the rows per step); "one split layer": both ranks on one batch.
    """
    rows = []
    for name, mode, batches in (("one device", "whole", 1), ("two replicas", "replica", 2),
                                ("one split layer", "split", 1)):
        for _, r in per_size(frame, mode).iterrows():
            rows.append({"setup": name, "batch": int(r.batch), "hidden": int(r.hidden),
                         "latency_ms": float(r.step_ms),
                         "throughput_rows_per_s": batches * int(r.batch) / (float(r.step_ms) / 1e3)})
    return pd.DataFrame(rows)


def describe_break_even(b: BreakEven) -> str:
    """"88.6 MFLOP (one-rank compute C = 1.92 ms)", or the reason when there is no crossing."""
    if not math.isfinite(b.work_flops) or b.work_flops == 0:
        return b.reason
    return f"{b.work_flops / 1e6:.3g} MFLOP (one-rank compute C = {b.C_ms:.3g} ms)"


def summary_table(link, table: pd.DataFrame, measured: BreakEven, predicted: BreakEven) -> pd.DataFrame:
    """The hand-in table: the link, the break-even (measured and predicted) and the best speedup."""
    best = table.loc[table["speedup"].idxmax()]
    show = describe_break_even
    items = [("link", f"{link.backend}/{link.device}, {link.world_size} ranks: "
                      f"latency {link.latency_ms * 1e3:.0f} us, "
                      f"busbw {link.busbw_GBps:.3g} GB/s"),
             ("break-even, measured", show(measured)), ("break-even, predicted", show(predicted)),
             ("best measured speedup", f"{best.speedup:.2f}x at {int(best.batch)}x{int(best.hidden)} "
                                       f"(eta {best.eta:.2f})"),
             ("median |prediction error| of T2", f"{100 * float(np.median(np.abs(table['rel_error']))):.1f}%")]
    return pd.DataFrame(items, columns=["quantity", "value"])
