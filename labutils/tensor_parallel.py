"""Tensor parallelism: the article's toy split, a Megatron-style MLP block on N ranks, and its timing.

Reading order:
1. the toy split, in exact integers: A by columns, B by rows, one sum at the end; and the wrong
   split that sums pre-activations across ReLU;
2. the MLP block  out = LayerNorm(x + act(x W1 + b1) W2 + b2): W1 split by columns, W2 by rows,
   ONE all-reduce of the (batch x hidden) output; residual, b2 and LayerNorm are serial work that
   every rank repeats on the full output;
3. floating point: the same layer in float32 / bfloat16 / float16 with other summation orders,
   against a float64 reference, and the dtype-aware tolerance used to check a split;
4. a step timer: serial + compute + communication = total, per rank;
5. the measurement protocol of notebook 06: T1 (one rank, whole layer) and T2 (two ranks, split),
   the budget's inputs estimated from them and the measured link, predicted T2 and break-even;
   overlap of chunked all-reduces with compute; replicas against shards;
6. `python -m labutils tp-check`: the split block on N ranks, checked against the whole.

Workers (functions a spawned rank runs) live here and are started with `labutils.launch.launch`.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

import numpy as np
import pandas as pd

from labutils.validate import LabInputError, check_choice, check_int

# --- 1. the toy split (exact integers) ----------------------------------------------------------

# x (1x2), A (2x4), ReLU, B (4x2). Pre-activations x A = [1, 1, -1, 4]: the third is 2 - 3 < 0.
TOY_X = np.array([[1, -1]], dtype=np.int64)
TOY_A = np.array([[2, 3, 2, 3],
                  [1, 2, 3, -1]], dtype=np.int64)
TOY_B = np.array([[2, -1],
                  [-1, 2],
                  [1, 3],
                  [-1, 2]], dtype=np.int64)


def relu(v):
    """max(v, 0) elementwise, for numpy integer or float arrays."""
    return np.maximum(v, 0)


def toy_whole(x=TOY_X, A=TOY_A, B=TOY_B) -> np.ndarray:
    """The whole network on one device: ReLU(x A) B."""
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


def _parts(n_columns: int, parts: int, name: str = "parts") -> list[slice]:
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
    pre, hid, con = [], [], []
    for cols in _parts(A.shape[1], parts):
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
    pre, hid, con = [], [], []
    for d in range(A.shape[0]):
        p = x[:, d:d + 1] @ A[d:d + 1, :]
        pre.append(p)
        hid.append(relu(p))
        con.append(relu(p) @ B)
    return ToySplit(tuple(pre), tuple(hid), tuple(con))


def relu_of_sum_vs_sum_of_relu(a: int = 2, b: int = -3) -> tuple[int, int]:
    """(ReLU(a + b), ReLU(a) + ReLU(b)): (0, 2) for the article's 2 and -3."""
    return int(relu(a + b)), int(relu(a) + relu(b))


def toy_worker(ctx) -> dict:
    """Rank r computes its toy contribution in int64 and all-reduces it: every rank gets [-3, 9]."""
    import torch
    import torch.distributed as dist

    cols = _parts(TOY_A.shape[1], ctx.world_size, "world_size")[ctx.rank]
    part = toy_split(TOY_X, TOY_A[:, cols], TOY_B[cols, :], parts=1)
    contribution = torch.as_tensor(part.contributions[0], device=ctx.device)
    total = contribution.clone()
    dist.all_reduce(total)
    return {"rank": ctx.rank, "columns": (cols.start, cols.stop), "pre_activation": part.pre_activations[0].tolist(),
            "contribution": contribution.cpu().tolist(), "total": total.cpu().tolist()}


def check_toy_contribution(answer, x=((-1, 2),)) -> str:
    """Exercise checker: device 2's contribution ReLU(x A[:, 2:4]) B[2:4, :] for a new input x.

    Recognises the usual slips (no ReLU, device 1's part, the whole output, the wrong split)
    and answers with a hint rather than right/wrong.
    """
    x = np.asarray(x, dtype=np.int64).reshape(1, 2)
    if answer is None:
        return "Replace None with device 2's contribution, two numbers such as [a, b]."
    try:
        got = np.asarray(answer, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        return f"Give two numbers, e.g. [a, b]; got {answer!r}."
    if got.size != 2:
        return f"Device 2's contribution is a 1x2 row (two numbers); got {got.size} number(s)."
    right = toy_split(x).contributions[1].reshape(-1)
    if np.array_equal(got, right):
        other = toy_split(x).contributions[0].reshape(-1).tolist()
        return (f"Right: {right.tolist()}. Add device 1's {other} and you "
                f"get the whole output {toy_whole(x).reshape(-1).tolist()}, which is what the all-reduce delivers.")
    slips = {
        "no_relu": ((x @ TOY_A[:, 2:4]) @ TOY_B[2:4, :], "You skipped ReLU: clip device 2's hidden values "
                    "x A[:, 2:4] at zero before multiplying by B's rows 2 and 3."),
        "device1": (toy_split(x).contributions[0], "That is device 1's part (columns 0-1 of A, rows 0-1 of B). "
                    "Device 2 owns columns 2-3 of A and rows 2-3 of B."),
        "whole": (toy_whole(x), "That is the whole output, the sum after the all-reduce; the question asks "
                  "for device 2's part alone."),
        "wrong": (toy_wrong_split(x).contributions[1], "That is the wrong split (A cut by rows): device 2 would "
                  "hold partial pre-activations, and ReLU of a partial sum is not a part of ReLU of the sum."),
        "columns": (relu(x @ TOY_A[:, 2:4]) @ TOY_B[:2, :], "Use B's rows 2 and 3, the rows that meet device 2's "
                    "hidden columns, not rows 0 and 1."),
    }
    for expected, hint in slips.values():
        if np.array_equal(got, np.asarray(expected).reshape(-1)):
            return hint
    return (f"Not quite ({got.tolist()}). Step by step: h = x A[:, 2:4] (two numbers), clip at zero, "
            "then h B[2:4, :] (two numbers).")


# --- 2. the Megatron-style MLP block ----------------------------------------------------------------

DTYPES = ("float64", "float32", "bfloat16", "float16")
ACTIVATIONS = ("relu", "gelu")


def torch_dtype(name: str):
    import torch

    return getattr(torch, check_choice("dtype", name, DTYPES))


def element_bytes(dtype_name: str) -> int:
    return {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}[check_choice("dtype", dtype_name, DTYPES)]


@dataclass(frozen=True)
class LayerSize:
    """One layer of the sweep: `batch` rows of width `hidden`, an MLP of width `ffn` (default 4 hidden)."""

    batch: int
    hidden: int
    ffn: int = 0

    def __post_init__(self):
        check_int("batch", self.batch, low=1)
        check_int("hidden", self.hidden, low=1)
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        check_int("ffn", self.ffn, low=1)

    @property
    def flops(self) -> float:
        """Multiply-adds of both linears, counted as 2 flops each: 2 * 2 * batch * hidden * ffn."""
        return 4.0 * self.batch * self.hidden * self.ffn

    def output_bytes(self, dtype_name: str = "float32") -> int:
        """Bytes of the all-reduced output, batch x hidden elements: the budget's V."""
        return self.batch * self.hidden * element_bytes(dtype_name)

    @property
    def label(self) -> str:
        return f"{self.batch}x{self.hidden}"


def as_size(size) -> LayerSize:
    """A LayerSize from a LayerSize, a (batch, hidden[, ffn]) tuple or a dict."""
    if isinstance(size, LayerSize):
        return size
    if isinstance(size, dict):
        return LayerSize(**size)
    return LayerSize(*size)


@dataclass(frozen=True)
class MLPWeights:
    """Full (or sharded) weights: W1 (hidden x ffn), b1 (ffn), W2 (ffn x hidden), b2 (hidden)."""

    W1: object
    b1: object
    W2: object
    b2: object


def mlp_weights(hidden: int, ffn: int, seed: int = 0, dtype: str = "float32", device: str = "cpu") -> MLPWeights:
    """Deterministic full weights from `seed`, scaled 1/sqrt(fan_in) so outputs stay near 1.

    Drawn in float64 on the CPU and then cast, so every rank (and every dtype) slices the same
    numbers.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    W1 = torch.randn(hidden, ffn, generator=g, dtype=f64) / math.sqrt(hidden)
    b1 = torch.randn(ffn, generator=g, dtype=f64) * 0.1
    W2 = torch.randn(ffn, hidden, generator=g, dtype=f64) / math.sqrt(ffn)
    b2 = torch.randn(hidden, generator=g, dtype=f64) * 0.1
    dt = torch_dtype(dtype)
    return MLPWeights(*(t.to(device=device, dtype=dt) for t in (W1, b1, W2, b2)))


def mlp_input(batch: int, hidden: int, seed: int = 0, dtype: str = "float32", device: str = "cpu"):
    """Deterministic input x (batch x hidden), standard normal, from `seed` (other stream than the weights)."""
    import torch

    g = torch.Generator().manual_seed(seed + 1_000_003)
    return torch.randn(batch, hidden, generator=g, dtype=torch.float64).to(device=device, dtype=torch_dtype(dtype))


def shard(weights: MLPWeights, rank: int, world_size: int) -> MLPWeights:
    """Rank `rank`'s slice: W1 and b1 by columns (column-parallel), W2 by rows (row-parallel).

    b2 is kept whole: it is added once, after the all-reduce.
    """
    ffn = weights.W1.shape[1]
    cols = _parts(ffn, world_size, "world_size")[rank]
    return MLPWeights(weights.W1[:, cols].contiguous(), weights.b1[cols].contiguous(),
                      weights.W2[cols, :].contiguous(), weights.b2)


def _activation(name: str):
    import torch.nn.functional as F

    return {"relu": F.relu, "gelu": F.gelu}[check_choice("activation", name, ACTIVATIONS)]


def mlp_partial(x, w: MLPWeights, activation: str = "relu"):
    """One rank's contribution act(x W1_r + b1_r) W2_r, before the all-reduce (no b2)."""
    return _activation(activation)(x @ w.W1 + w.b1) @ w.W2


def serial_tail(x, y_sum, b2):
    """The work every rank repeats on the full output: residual, bias and LayerNorm."""
    import torch.nn.functional as F

    z = x + y_sum + b2
    return F.layer_norm(z, z.shape[-1:])


def mlp_block(x, weights: MLPWeights, activation: str = "relu"):
    """The whole block on one device: LayerNorm(x + act(x W1 + b1) W2 + b2)."""
    return serial_tail(x, mlp_partial(x, weights, activation), weights.b2)


def summed_partials(x, weights: MLPWeights, shards: int, activation: str = "relu", reverse: bool = False):
    """The MLP output (before the tail) as the sum of `shards` partials, added one by one in the
    layer's dtype (ranks 0..N-1, or N-1..0 with `reverse`): a split's summation order on one device.
    """
    parts = [mlp_partial(x, shard(weights, r, shards), activation) for r in range(shards)]
    if reverse:
        parts = parts[::-1]
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    return total + weights.b2


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def dist_all_reduce(t, async_op: bool = False):
    """Sum `t` in place over all ranks (torch.distributed.all_reduce); a handle with `async_op`."""
    import torch.distributed as dist

    return dist.all_reduce(t, async_op=async_op)


def tp_block_step(x, w: MLPWeights, activation: str, timer, reduce: bool = True):
    """One tensor-parallel step on this rank, timed in three sections (all ranks call it together).

    compute: act(x W1_r + b1_r) W2_r; communication: all_reduce(sum) of the batch x hidden output;
    serial: residual + b2 + LayerNorm on the full output. With one rank (or `reduce=False`,
    a rank holding the whole layer) there is nothing to reduce and the step is the whole layer.
    """
    with timer.section("compute"):
        y = mlp_partial(x, w, activation)
    with timer.section("communication"):
        if reduce and _world_size() > 1:
            dist_all_reduce(y)
    with timer.section("serial"):
        return serial_tail(x, y, w.b2)


# --- 3. floating point -------------------------------------------------------------------------

def eps(dtype: str) -> float:
    """Machine epsilon (spacing of numbers at 1): float32 1.19e-7, bfloat16 7.8e-3, float16 9.8e-4."""
    import torch

    return float(torch.finfo(torch_dtype(dtype)).eps)


def tolerance(dtype: str, reduce_len: int, shards: int = 2) -> float:
    """Largest accepted max|a - b| / max|b| between two results of the same layer in `dtype`.

    2 eps_acc sqrt(K) + eps (N + 1): the first term for the K-long dot products, accumulated in
    float32 for the half types (eps_acc = float32's eps) and in the dtype itself otherwise; the
    second for rounding each of the N partials and their sum to `dtype` (half an eps each, twice
    over for the two linears). bfloat16, K = 1024, N = 2: 0.023; float32: 8e-6.
    """
    check_int("reduce_len", reduce_len, low=1)
    check_int("shards", shards, low=1)
    acc = "float32" if dtype in ("bfloat16", "float16") else dtype
    return 2.0 * eps(acc) * math.sqrt(reduce_len) + eps(dtype) * (shards + 1)


def compare(y, ref) -> dict:
    """max/mean absolute difference of y against ref, and both relative to max|ref| (in float64)."""
    a = y.double()
    b = ref.double().to(a.device)
    diff = (a - b).abs()
    scale = float(b.abs().max()) or 1.0
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()),
            "max_rel": float(diff.max()) / scale, "mean_rel": float(diff.mean()) / scale}


def precision_study(size=(32, 256), dtypes=("float32", "bfloat16", "float16"), shard_counts=(1, 2, 4, 8),
                    seed: int = 0, activation: str = "relu", device: str = "cpu") -> pd.DataFrame:
    """The MLP output (x W1 -> act -> W2, + b2) in each dtype and summation order, against float64.

    Rows: dtype, shards, order ("ranks 0..N-1" or reversed), difference to the float64 whole
    (max_abs, mean_abs, max_rel, mean_rel), `vs_whole_rel` = max_rel against the same dtype's
    one-device result, and `tolerance` (see `tolerance`) with `within` = vs_whole_rel <= tolerance.
    """
    size = as_size(size)
    ref_w = mlp_weights(size.hidden, size.ffn, seed, "float64", device)
    ref = summed_partials(mlp_input(size.batch, size.hidden, seed, "float64", device), ref_w, 1, activation)
    rows = []
    for dtype in dtypes:
        w = mlp_weights(size.hidden, size.ffn, seed, dtype, device)
        x = mlp_input(size.batch, size.hidden, seed, dtype, device)
        whole = summed_partials(x, w, 1, activation)
        for n in shard_counts:
            for reverse in ((False, True) if n > 2 else (False,)):
                y = summed_partials(x, w, n, activation, reverse)
                tol = tolerance(dtype, max(size.hidden, size.ffn), n)
                vs_whole = compare(y, whole)["max_rel"]
                order = f"ranks {n - 1}..0" if reverse else f"ranks 0..{n - 1}"
                rows.append({"dtype": dtype, "shards": n, "order": order, **compare(y, ref), "vs_whole_rel": vs_whole,
                             "tolerance": tol, "within": vs_whole <= tol})
    return pd.DataFrame(rows)


def tp_check_worker(ctx, size=(8, 64), seed: int = 0, dtypes=("float32",), activation: str = "relu") -> list[dict]:
    """Run the split block on this rank (one all-reduce) in each dtype and compare it with the whole.

    Every rank draws the same full weights from `seed`, keeps its slices, and also computes the
    whole block locally as the reference. `ok` = max_rel <= tolerance(dtype, K, N).
    """
    from labutils.timing import SectionTimer

    size = as_size(size)
    rows = []
    for dtype in dtypes:
        full = mlp_weights(size.hidden, size.ffn, seed, dtype, ctx.device)
        x = mlp_input(size.batch, size.hidden, seed, dtype, ctx.device)
        out = tp_block_step(x, shard(full, ctx.rank, ctx.world_size), activation, SectionTimer(ctx.device))
        diff = compare(out, mlp_block(x, full, activation))
        tol = tolerance(dtype, max(size.hidden, size.ffn), ctx.world_size)
        rows.append({"rank": ctx.rank, "world_size": ctx.world_size, "dtype": dtype, **diff, "tolerance": tol,
                     "ok": diff["max_rel"] <= tol, "device": ctx.device, "backend": ctx.backend})
    return rows


def run_tp_check(nproc: int = 2, size=(8, 64), dtypes=("float32",), seed: int = 0, backend: str = "gloo",
                 device: str = "cpu", activation: str = "relu", timeout_s: float = 120.0) -> pd.DataFrame:
    """Launch `tp_check_worker` on `nproc` ranks; one row per (dtype, rank)."""
    from labutils.launch import launch

    dtypes = (dtypes,) if isinstance(dtypes, str) else tuple(dtypes)
    _parts(as_size(size).ffn, nproc, "nproc")  # refuse here, not in every rank
    per_rank = launch(tp_check_worker, nproc, kwargs={"size": astuple(as_size(size)), "seed": seed, "dtypes": dtypes,
                                                      "activation": activation},
                      backend=backend, device=device, timeout_s=timeout_s)
    return pd.DataFrame([row for rows in per_rank for row in rows]).sort_values(["dtype", "rank"], ignore_index=True)


# --- 4. the step timer ----------------------------------------------------------------------------

SECTIONS = ("serial", "compute", "communication")


@dataclass(frozen=True)
class StepTimes:
    """One step on one rank, in ms: serial + compute + communication == total.

    `gap_ms` is the time between the timed sections (Python overhead), counted in `serial_ms`
    so that the three parts add up to the total measured around the whole step.
    """

    serial_ms: float
    compute_ms: float
    communication_ms: float
    total_ms: float
    gap_ms: float


def timed_step(step, device: str = "cpu"):
    """Run `step(timer)` once inside a "total" section; returns (step's result, StepTimes).

    `step` times its parts with `timer.section(name)` for name in SECTIONS (a part may be absent).
    On CUDA the sections are CUDA events on the current stream, on the CPU perf_counter intervals.
    """
    from labutils.timing import SectionTimer

    timer = SectionTimer(device)
    with timer.section("total"):
        result = step(timer)
    totals = timer.totals_ms()
    unknown = set(totals) - set(SECTIONS) - {"total"}
    if unknown:
        raise LabInputError(f"unknown timer section(s) {sorted(unknown)}; use {SECTIONS}")
    total = totals["total"]
    parts = {name: totals.get(name, 0.0) for name in SECTIONS}
    gap = max(0.0, total - sum(parts.values()))
    serial = total - parts["compute"] - parts["communication"]
    return result, StepTimes(serial, parts["compute"], parts["communication"], total, gap)


def median_times(samples: list[StepTimes]) -> dict:
    """Median of each part over repetitions; `total_ms` is the median total (parts then need not sum)."""
    frame = pd.DataFrame([s.__dict__ for s in samples])
    return {col: float(frame[col].median()) for col in frame.columns}


# --- 5. the measurement protocol ------------------------------------------------------------------

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
            if _world_size() > 1:
                handles.append(dist_all_reduce(y, async_op=True))
    with timer.section("communication"):
        for h in handles:
            h.wait()
    with timer.section("serial"):
        return serial_tail(x, torch.cat(pieces, dim=0), w.b2)


def _once(ctx, mode: str, step):
    """One aligned repetition of `step`: StepTimes on the ranks taking part, None elsewhere.

    "whole" runs on rank 0 alone while the other ranks wait, idle, in the closing barrier.
    """
    from labutils.timing import barrier

    barrier(ctx.device)
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

    from labutils.collectives import agree_iters

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
        if v[0] != "whole" and _world_size() > 1:
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

    `threads_per_rank` defaults to `default_threads(2)` for every mode: the one-rank baseline gets
    the threads of one rank of the split, so "one device" is the same on both sides.
    quick: 2 warm-up rounds and about 300 ms of repetitions (5..100) per size; else 5 and 2 s (15..400).
    """
    from labutils.launch import default_threads, launch

    nproc = check_int("nproc", nproc, low=1)
    for s in sizes:
        _parts(as_size(s).ffn, nproc, "nproc")  # refuse here, not in every rank
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    chunks = tuple(check_int("chunks", k, low=1) for k in np.atleast_1d(chunks).tolist())
    kwargs = {"sizes": [astuple(as_size(s)) for s in sizes], "modes": modes, "chunks": chunks, "seed": seed,
              "dtype": dtype, "warmup": 2 if quick else 5, "min_reps": 5 if quick else 15,
              "max_reps": 100 if quick else 400, "target_ms": 300.0 if quick else 2000.0}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(sizes), desc=f"{'+'.join(modes)} on {nproc} rank(s)", unit="size")
    on_report = (lambda rank, msg: bar.update(1) if rank == 0 else None) if bar else None
    try:
        per_rank = launch(measure_worker, nproc, kwargs=kwargs, backend=backend, device=device, timeout_s=timeout_s,
                          threads_per_rank=threads_per_rank or default_threads(2), on_report=on_report)
    finally:
        if bar is not None:
            bar.close()
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
    from `link` (a fit.LinkFit: latency_ms, busbw_GBps). For 2 ranks the ring factor 2(N-1)/N
    is 1, so V / busbw is exactly the all-reduce's bandwidth term.
    """
    c_rank = float(t2["compute_slowest_ms"] if "compute_slowest_ms" in t2 else t2["compute_ms"])
    eta = math.inf if c_rank <= 0 else float(t1["compute_ms"]) / (2 * c_rank)
    return BudgetInputs(float(t1["serial_ms"]), float(t1["compute_ms"]), min(eta, 1.0), int(Q), float(volume_bytes),
                        float(link.latency_ms), float(link.busbw_GBps), eta)


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


def validation_table(frame: pd.DataFrame, link) -> pd.DataFrame:
    """Per size: estimate the inputs from the "whole" and "split" rows, predict T2 with
    labutils.budget, and compare with the measured T2.

    Columns: batch, hidden, work_flops, volume_bytes, S_ms, C_ms, C_rank_ms, eta (capped),
    eta_measured, T1_ms, T2_ms (measured), comm_ms (measured, slowest rank), comm_pred_ms,
    T2_pred_ms, rel_error = (predicted - measured) / measured, speedup, speedup_pred (T1 / T2).
    """
    from labutils import budget

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
    from labutils import budget

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


def check_t2_prediction(answer_ms, inputs: BudgetInputs) -> str:
    """Exercise checker: T2 = S + C/(2 eta) + Q (latency + V/B), in ms, from a table row's inputs.

    Names the usual slips: eta left out, latency or the bandwidth term left out, S left out,
    V/B off by 1000 (seconds or microseconds taken for ms).
    """
    try:
        got = float(answer_ms)
    except (TypeError, ValueError):
        return f"Give a number of milliseconds; got {answer_ms!r}."
    S, C, eta, Q, lat, V, B = inputs.S_ms, inputs.C_ms, inputs.eta, inputs.Q, inputs.latency_ms, \
        inputs.volume_bytes, inputs.bandwidth_GBps
    wire_ms = V / (B * 1e9) * 1e3
    right = S + C / (2 * eta) + Q * (lat + wire_ms)
    if math.isclose(got, right, rel_tol=0.01):
        return (f"Right: {right:.3f} ms, of which {Q * (lat + wire_ms):.3f} ms is communication; "
                f"the one-rank time is {S + C:.3f} ms.")
    slips = [
        (S + C / 2 + Q * (lat + wire_ms), f"You used C/2: divide by 2 eta (eta = {eta:.2f}), the split's halves "
                                          "do not run at full efficiency."),
        (S + C / (2 * eta) + Q * wire_ms, "The latency is missing: every all-reduce pays it once, whatever its "
                                          "size."),
        (S + C / (2 * eta) + Q * lat, "The bandwidth term V/B is missing (or came out in seconds): V bytes at "
                                      "B GB/s take V / (B 1e9) s, that is V / (B 1e6) ms."),
        (C / (2 * eta) + Q * (lat + wire_ms), "S is missing: the serial work is in T2 too."),
        (S + C / (2 * eta) + Q * (lat + wire_ms * 1e3), "V/B came out 1000 times too large: V / (B 1e9) is in "
                                                        "seconds, V / (B 1e6) in ms."),
        (S + C / (2 * eta), "The communication is missing: Q (latency + V/B)."),
    ]
    for value, hint in slips:
        if math.isclose(got, value, rel_tol=0.01):
            return hint
    return (f"Not quite ({got:.4g} ms). Add three parts: S, C / (2 eta), and Q (latency + V / B) with V/B "
            "converted to ms.")


# --- the command line ------------------------------------------------------------------------------

def _cli(args) -> int:
    from labutils.launch import resolve_backend

    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    for d in dtypes:
        check_choice("dtypes", d, DTYPES)
    choice = resolve_backend(args.backend, args.device, args.nproc)
    frame = run_tp_check(args.nproc, (args.batch, args.hidden), dtypes, args.seed, choice.backend, choice.device,
                         timeout_s=args.timeout_s)
    print(f"{args.nproc} ranks, {choice.backend} on {choice.device}: split MLP block {args.batch}x{args.hidden} "
          "against the whole block")
    print(frame[["dtype", "rank", "max_abs", "max_rel", "tolerance", "ok"]].to_string(index=False))
    print("PASS" if frame["ok"].all() else "FAIL: a split differs from the whole by more than its tolerance")
    return 0 if frame["ok"].all() else 1


def add_cli(sub) -> None:
    """`python -m labutils tp-check [--nproc 2] [--dtypes float32,bfloat16] ...`"""
    parser = sub.add_parser("tp-check", help="run the column/row-parallel MLP block on N ranks and check it",
                            description="Run the Megatron-style MLP block split over N local ranks (one "
                                        "all-reduce) and compare every rank's output with the whole block "
                                        "within the dtype's tolerance. Exit status 1 when one differs.")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (must divide 4 * hidden) [2]")
    parser.add_argument("--batch", type=int, default=8, help="rows of the input [8]")
    parser.add_argument("--hidden", type=int, default=64, help="hidden width; the MLP is 4x wider [64]")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes [float32,bfloat16]")
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.set_defaults(func=_cli)
