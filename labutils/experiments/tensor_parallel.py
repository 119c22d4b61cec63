"""Tensor parallelism: the article's toy split, a Megatron-style MLP block on N ranks, and its timing.

Reading order:
1. the toy split, in exact integers: A by columns, B by rows, one sum at the end; and the wrong
   split that sums pre-activations across ReLU;
2. the MLP block  out = LayerNorm(x + act(x W1 + b1) W2 + b2): W1 split by columns, W2 by rows,
   ONE all-reduce of the (tokens x hidden) output; residual, b2 and LayerNorm are serial work that
   every rank repeats on the full output. The layer's rows are tokens: `LayerSize.batch` is the
   number of rows, batch x sequence length in a transformer, so the all-reduce moves
   V = tokens x hidden x bytes per element (Shoeybi et al. 2019, section 3: the b x s x h output);
3. floating point: the same layer in float32 / bfloat16 / float16 with other summation orders,
   against a float64 reference, and the dtype-aware tolerance used to check a split;
   `shard_error_sentence` says from that table how the error changed with the shard count;
4. a step timer: serial + compute + communication = total, per rank; `split_step_sentence` says
   from the medians how the split step compared with the whole layer and its all-reduce with its
   compute;
5. `python -m labutils tp-check`: the split block on N ranks, checked against the whole (the
   backward check, with f and g, is labutils.experiments.megatron).

Timing the split on ranks is labutils.experiments.split_timing; holding the two-device budget against
it, labutils.experiments.validation.

Workers (functions a spawned rank runs) live here and are run by the kernel's rank pool
(`labutils.measure.pool.shared_pool`).
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F

from labutils.core.busbw import element_bytes
from labutils.core.inputs import LabInputError, check_choice, check_int, check_range
from labutils.measure.buffers import torch_dtype
from labutils.measure.pool import shared_pool
from labutils.measure.timing import SectionTimer, group_size
from labutils.model.toy_split import TOY_A, TOY_B, TOY_X, split_columns, toy_split

# --- 1. the toy split on real ranks (the arithmetic: labutils.model.toy_split) --------------------

def toy_worker(ctx) -> dict:
    """Rank r computes its toy contribution in int64 and all-reduces it: every rank gets [-3, 9]."""
    cols = split_columns(TOY_A.shape[1], ctx.world_size, "world_size")[ctx.rank]
    part = toy_split(TOY_X, TOY_A[:, cols], TOY_B[cols, :], parts=1)
    contribution = torch.as_tensor(part.contributions[0], device=ctx.device)
    total = contribution.clone()
    dist.all_reduce(total)
    return {"rank": ctx.rank, "columns": (cols.start, cols.stop), "pre_activation": part.pre_activations[0].tolist(),
            "contribution": contribution.cpu().tolist(), "total": total.cpu().tolist()}


# --- 2. the Megatron-style MLP block ----------------------------------------------------------------

LAYER_DTYPES = ("float64", "float32", "bfloat16", "float16")  # the layer's dtypes (names: labutils.core.busbw)
ACTIVATIONS = ("relu", "gelu")


@dataclass(frozen=True)
class LayerSize:
    """One layer of the sweep: `batch` rows of width `hidden`, an MLP of width `ffn` (default 4 hidden).

    The rows are tokens: in a transformer `batch` stands for batch x sequence length, every token a
    row that the layer treats alike.
    """

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
        """Multiply-adds of both linears, counted as 2 flops each: 2 * 2 * tokens * hidden * ffn."""
        return 4.0 * self.batch * self.hidden * self.ffn

    def output_bytes(self, dtype_name: str = "float32") -> int:
        """Bytes of the all-reduced output, tokens x hidden elements (`batch` rows): the budget's V."""
        return self.batch * self.hidden * element_bytes(dtype_name)


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


WEIGHT_CACHE_LIMIT_BYTES = 256 * 2**20  # a rank keeps at most this much of drawn weights for later calls
_weight_cache: dict[tuple, MLPWeights] = {}


def _weights_bytes(w: MLPWeights) -> int:
    return sum(t.numel() * t.element_size() for t in (w.W1, w.b1, w.W2, w.b2))


def _generator(seed: int, device: str):
    """A generator on `device` (its own random stream: the same seed gives the same numbers on every
    rank of one device type, not across CPU and GPU)."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


def mlp_weights(hidden: int, ffn: int, seed: int = 0, dtype: str = "float32", device: str = "cpu") -> MLPWeights:
    """Deterministic full weights from `seed`, scaled 1/sqrt(fan_in) so outputs stay near 1.

    Drawn on `device` in float32 with a generator seeded by `seed` and then cast, so every rank
    (and every dtype, float64 too) slices the same numbers. Kept in this process's cache, keyed by
    (hidden, ffn, seed, dtype, device), so later calls on the same rank do not draw again; the
    cache is emptied when it would hold more than WEIGHT_CACHE_LIMIT_BYTES. Callers must not
    change the tensors in place (megatron's checks work on detached clones).
    """
    key = (int(hidden), int(ffn), int(seed), str(dtype), str(device))
    if key in _weight_cache:
        return _weight_cache[key]
    g = _generator(seed, device)
    f32 = torch.float32

    def draw(*shape):
        return torch.randn(*shape, generator=g, dtype=f32, device=device)

    W1 = draw(hidden, ffn) / math.sqrt(hidden)
    b1 = draw(ffn) * 0.1
    W2 = draw(ffn, hidden) / math.sqrt(ffn)
    b2 = draw(hidden) * 0.1
    dt = torch_dtype(dtype)
    weights = MLPWeights(*(t.to(dtype=dt) for t in (W1, b1, W2, b2)))
    size = _weights_bytes(weights)
    if size + sum(_weights_bytes(w) for w in _weight_cache.values()) > WEIGHT_CACHE_LIMIT_BYTES:
        _weight_cache.clear()
    if size <= WEIGHT_CACHE_LIMIT_BYTES:
        _weight_cache[key] = weights
    return weights


def weights_checksum(w: MLPWeights) -> float:
    """sum(|W1| + |b1| + |W2| + |b2|) in float64: equal on ranks holding the same weights."""
    return float(sum(t.double().abs().sum() for t in (w.W1, w.b1, w.W2, w.b2)))


def mlp_input(batch: int, hidden: int, seed: int = 0, dtype: str = "float32", device: str = "cpu"):
    """Deterministic input x (tokens x hidden, `batch` rows), standard normal, drawn on `device` in float32 from
    `seed` (other stream than the weights) and cast to `dtype`."""
    g = _generator(seed + 1_000_003, device)
    return torch.randn(batch, hidden, generator=g, dtype=torch.float32, device=device).to(torch_dtype(dtype))


def shard(weights: MLPWeights, rank: int, world_size: int) -> MLPWeights:
    """Rank `rank`'s slice: W1 and b1 by columns (column-parallel), W2 by rows (row-parallel).

    b2 is kept whole: it is added once, after the all-reduce.
    """
    ffn = weights.W1.shape[1]
    cols = split_columns(ffn, world_size, "world_size")[rank]
    return MLPWeights(weights.W1[:, cols].contiguous(), weights.b1[cols].contiguous(),
                      weights.W2[cols, :].contiguous(), weights.b2)


def _activation(name: str):
    return {"relu": F.relu, "gelu": F.gelu}[check_choice("activation", name, ACTIVATIONS)]


def mlp_partial(x, w: MLPWeights, activation: str = "relu"):
    """One rank's contribution act(x W1_r + b1_r) W2_r, before the all-reduce (no b2)."""
    return _activation(activation)(x @ w.W1 + w.b1) @ w.W2


def serial_tail(x, y_sum, b2):
    """The work every rank repeats on the full output: residual, bias and LayerNorm."""
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


def dist_world_size() -> int:
    """The ranks taking part (`timing.group_size`: 1 without a group or in a solo task)."""
    return group_size()


def dist_all_reduce(t, async_op: bool = False):
    """Sum `t` in place over all ranks (torch.distributed.all_reduce); a handle with `async_op`."""
    return dist.all_reduce(t, async_op=async_op)


def tp_block_step(x, w: MLPWeights, activation: str, timer, reduce: bool = True):
    """One tensor-parallel step on this rank, timed in three sections (all ranks call it together).

    compute: act(x W1_r + b1_r) W2_r; communication: all_reduce(sum) of the tokens x hidden output;
    serial: residual + b2 + LayerNorm on the full output. With one rank (or `reduce=False`,
    a rank holding the whole layer) there is nothing to reduce and the step is the whole layer.
    """
    with timer.section("compute"):
        y = mlp_partial(x, w, activation)
    with timer.section("communication"):
        if reduce and dist_world_size() > 1:
            dist_all_reduce(y)
    with timer.section("serial"):
        return serial_tail(x, y, w.b2)


# --- 3. floating point -------------------------------------------------------------------------

def eps(dtype: str) -> float:
    """Machine epsilon (spacing of numbers at 1): float32 1.19e-7, bfloat16 7.8e-3, float16 9.8e-4."""
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


def ulps_apart(y, ref) -> float:
    """max|y - ref| in units in the last place of `ref`'s dtype at its largest value: the spacing
    eps * 2^floor(log2 max|ref|) of the numbers around max|ref|, the coarsest in the output (so a
    figure of 1 is one rounding step of the largest outputs). 0 where the two are equal."""
    info = torch.finfo(ref.dtype)
    a, b = y.double(), ref.double().to(y.device)
    top = max(float(b.abs().max()), info.tiny)
    return float((a - b).abs().max()) / (info.eps * 2.0 ** math.floor(math.log2(top)))


def precision_study(size=(32, 256), dtypes=("float32", "bfloat16", "float16"), shard_counts=(1, 2, 4, 8),
                    seed: int = 0, activation: str = "relu", device: str = "cpu") -> pd.DataFrame:
    """The MLP output (x W1 -> act -> W2, + b2) in each dtype and summation order, against float64.

    Rows: dtype, shards, order ("ranks 0..N-1", and reversed from 3 shards on: with two, a + b =
    b + a in floating point too, so the reverse order would repeat the row), difference to the
    float64 whole (max_abs, mean_abs, max_rel, mean_rel), `vs_whole_rel` = max_rel against the
    same dtype's one-device result, `vs_whole_ulps` the same difference in units in the last place
    at the largest output (`ulps_apart`), and `tolerance` (see `tolerance`) with `within` = vs_whole_rel <= tolerance.
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
                             "vs_whole_ulps": ulps_apart(y, whole), "tolerance": tol, "within": vs_whole <= tol})
    return pd.DataFrame(rows)


def _two_figures(value: float) -> float:
    """`value` as the sentences print it, to two significant figures (so that what they compare is what they show)."""
    return float(f"{value:.1e}")


def shard_error_sentence(frame: pd.DataFrame, dtype: str) -> str:
    """How `dtype`'s error against float64 changed with the shard count in `precision_study`'s table.

    Per shard count the largest max_rel over the summation orders, printed to two significant
    figures; the sentence compares the whole layer (the fewest shards) with the most shards at
    those figures: larger at every step ("it grows with the number of partials"), larger at the end
    but not at every step, the same, or smaller. Each partial is rounded to `dtype` before the sum,
    so N shards add N roundings (and N - 1 for the sum) where the whole layer has one.
    """
    rows = frame[frame["dtype"] == dtype]
    if rows.empty:
        raise LabInputError(f"dtype={dtype!r} is not in the table; it holds {sorted(set(frame['dtype']))}")
    per_count = rows.groupby("shards")["max_rel"].max().sort_index()
    errors = [_two_figures(v) for v in per_count]
    counts = [int(n) for n in per_count.index]
    listed = ", ".join(f"{e:.1e} {'whole' if n == 1 else f'with {n} shards'}" for n, e in zip(counts, errors))
    head = f"{dtype}: largest error against float64 {listed}"
    first, last, most = errors[0], errors[-1], counts[-1]
    fewest = "whole" if counts[0] == 1 else f"with {counts[0]} shards"
    if len(errors) == 1:
        return f"{head}: one shard count only, nothing to compare."
    if last == first:
        return f"{head}: the same {fewest} and with {most} shards, at the figures printed."
    if last > first:
        steady = all(b > a for a, b in zip(errors, errors[1:]))
        how = ("it grows with the number of partials" if steady else
               f"it is larger with {most} shards than {fewest}, though not at every step")
        return f"{head}: {how}, {last / first:.3g}x from {fewest} to {most} shards."
    return f"{head}: smaller with {most} shards than {fewest}, by {first / last:.3g}x."


def tp_check_worker(ctx, size=(8, 64), seed: int = 0, dtypes=("float32",), activation: str = "relu") -> list[dict]:
    """Run the split block on this rank (one all-reduce) in each dtype and compare it with the whole.

    Every rank draws the same full weights from `seed`, keeps its slices, and also computes the
    whole block locally as the reference. `ok` = max_rel <= tolerance(dtype, K, N).
    """
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
    dtypes = (dtypes,) if isinstance(dtypes, str) else tuple(dtypes)
    split_columns(as_size(size).ffn, nproc, "nproc")  # refuse here, not in every rank
    per_rank = shared_pool(nproc, backend, device).run(
        tp_check_worker, kwargs={"size": astuple(as_size(size)), "seed": seed, "dtypes": dtypes,
                                 "activation": activation}, timeout_s=timeout_s)
    return pd.DataFrame([row for rows in per_rank for row in rows]).sort_values(["dtype", "rank"], ignore_index=True)


# --- 4. the step timer ----------------------------------------------------------------------------

TP_SECTIONS = ("serial", "compute", "communication")


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

    `step` times its parts with `timer.section(name)` for name in TP_SECTIONS (a part may be absent).
    On CUDA the sections are CUDA events on the current stream, on the CPU perf_counter intervals.
    """
    timer = SectionTimer(device)
    with timer.section("total"):
        result = step(timer)
    totals = timer.totals_ms()
    unknown = set(totals) - set(TP_SECTIONS) - {"total"}
    if unknown:
        raise LabInputError(f"unknown timer section(s) {sorted(unknown)}; use {TP_SECTIONS}")
    total = totals["total"]
    parts = {name: totals.get(name, 0.0) for name in TP_SECTIONS}
    gap = max(0.0, total - sum(parts.values()))
    serial = total - parts["compute"] - parts["communication"]
    return result, StepTimes(serial, parts["compute"], parts["communication"], total, gap)


def median_times(samples: list[StepTimes]) -> dict:
    """Median of each part over repetitions; `total_ms` is the median total (parts then need not sum)."""
    frame = pd.DataFrame([s.__dict__ for s in samples])
    return {col: float(frame[col].median()) for col in frame.columns}


def _ratio_words(ratio: float, more: str, less: str, same: str) -> str:
    """`more`, `less` or `same` for a ratio as printed (two decimals)."""
    shown = round(ratio, 2)
    return more if shown > 1 else less if shown < 1 else same


def split_step_sentence(whole_ms: float, split_ms: float, communication_ms: float, compute_ms: float,
                        nproc: int, rank: int | None = None) -> str:
    """The timed step in words, from its medians (ms): the speedup whole / split, and one rank's
    all-reduce against the same rank's compute (ratios rounded as printed, two decimals, before
    they are compared). `rank` names that rank (notebook 06 passes the slower one,
    `slower_split_rank`: its all-reduce holds the least waiting for the other rank's compute)."""
    for name, value in (("whole_ms", whole_ms), ("split_ms", split_ms), ("compute_ms", compute_ms)):
        check_range(name, value, low=0, low_open=True, high=math.inf, high_open=True, unit="ms")
    check_range("communication_ms", communication_ms, low=0, high=math.inf, high_open=True, unit="ms")
    speedup = whole_ms / split_ms
    faster = _ratio_words(speedup, "faster than", "slower than", "as fast as")
    share = communication_ms / compute_ms
    longer = _ratio_words(share, "longer than", "shorter than", "as long as")
    who, whose = ("Its all-reduce", "its") if rank is None else (f"On rank {rank}, the slower, the all-reduce",
                                                                  "that rank's")
    return (f"The split over {nproc} ranks took {split_ms:.3f} ms, the whole layer {whole_ms:.3f} ms (step_ms: each "
            f"step timed to its slower rank, median over the repetitions): "
            f"speedup {speedup:.2f}x, the split {faster} the whole. {who} took "
            f"{1e3 * communication_ms:.0f} us, {share:.2f}x {whose} compute ({1e3 * compute_ms:.0f} us): "
            f"{longer} the compute.")


def slower_split_rank(steps: pd.DataFrame) -> dict:
    """The "split" row (of `split_timing.time_layers`) of the rank with the longest median `total_ms`,
    the slower rank, whose steps set `step_ms`: its all-reduce and its compute, set side by side,
    are one rank's, never one rank's wait against the other's work."""
    split = steps[steps["mode"] == "split"]
    if split.empty:
        raise LabInputError("steps holds no 'split' rows; time_layers must run the mode 'split'")
    return split.loc[split["total_ms"].idxmax()].to_dict()


def timing_size_sentence(flops_per_s: float, tokens: int, hidden: int) -> str:
    """What the chosen block predicts before it is timed: its work 16 b h^2 flop (W1: h x 4h, W2:
    4h x h, two flop per multiply-add) over one rank's measured rate, in ms of whole-layer compute."""
    check_range("flops_per_s", flops_per_s, low=0, low_open=True, high=math.inf, high_open=True, unit="flop/s")
    work = as_size((tokens, hidden)).flops
    return (f"One rank computes {flops_per_s / 1e9:.3g} GFLOP/s here (fp32 matrix product), so section 5 times the "
            f"{tokens}x{hidden} block (tokens x hidden): 16·{tokens}·{hidden}² = {work / 1e6:.4g} MFLOP, "
            f"about {1e3 * work / flops_per_s:.2g} ms of whole-layer compute at that rate.")


def vs_whole_sentence(frame: pd.DataFrame, dtype: str) -> str:
    """The split against the whole layer in `dtype` (`precision_study`'s vs_whole columns, the
    split rows): the largest relative difference, that difference in ulps (one ulp: the split and
    the whole differ by one rounding step where they differ most), and whether every shard count
    and order gave the same figure."""
    rows = frame[(frame["dtype"] == dtype) & (frame["shards"] > 1)]
    if rows.empty:
        raise LabInputError(f"dtype={dtype!r} has no split rows in the table; it holds {sorted(set(frame['dtype']))}")
    rel, ulps = float(rows["vs_whole_rel"].max()), float(rows["vs_whole_ulps"].max())
    steps = "one ulp" if round(ulps, 2) == 1 else f"{ulps:.3g} ulps"
    same = (", the same at every shard count and order" if len(rows) > 1 and rows["vs_whole_rel"].nunique() == 1
            else "")
    return (f"split vs whole at most {rel:.1e} of max|whole| (vs_whole_rel): {steps} of {dtype} at its largest "
            f"output{same}")
