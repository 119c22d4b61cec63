"""Data-parallel training, the model: gradient and bucket sizes of the MLP, and the predicted step
time (notebook 10, the DDP scaling dashboard). Pure functions: no launcher, no torch, no files.

DDP's buckets (PyTorch's DistributedDataParallel documentation and its design note, "Distributed
Data Parallel" in the notes): the parameters are packed into buckets in *reverse* order of
`model.parameters()`, the order in which backward produces their gradients (after the first
iteration DDP rebuilds the buckets in the order it saw them become ready); a bucket closes once it
holds `bucket_cap_mb` MiB (25 by default). With the default cap (`bucket_cap_mb=None`) the first
bucket closes at 1 MiB, so the last layers' gradients start moving early; in recent PyTorch (2.13
checked; older releases gave every cap a 1 MiB first bucket) an explicit cap, even 25, uses that
cap for the first bucket too (`DEFAULT_BUCKET_MB` stands for
DDP's default here, and the lab passes None for it). When the last gradient of a bucket is ready,
DDP's autograd hook launches that bucket's all-reduce asynchronously, while backward goes on
computing earlier layers: that is the overlap. Two estimates bracket what overlap can do, with
neither contention between the two (cores, SMs, memory bandwidth) nor waits for a slower rank:

    no-overlap estimate    = forward + backward + comm + optimizer
    ideal-overlap estimate = forward + max(backward, comm) + optimizer   (only backward can hide comm)

Neither is a bound: a measured step can exceed the first (contention, stragglers) or undercut the
second (an all-reduce faster than the curve says). Times in ms, bytes, decimal GB/s. Compute comes
from the one-rank step (or, where ranks share a GPU, from the N-rank run's own backward:
`estimate_compute`); comm = the sum over DDP's buckets of the measured all-reduce curve read at
each bucket's size (`bucket_comm_ms`, log-log interpolation of the sweep: gloo's bandwidth falls
once a message leaves the CPU's caches, so one alpha-beta line over the whole sweep misses real
gradients by a large factor), or the line buckets * alpha_us / 1e3 + 2(N-1)/N * grad_bytes /
(busbw_GBps * 1e6) when no sweep is given. labutils.experiments.ddp_step.contention_worker measures
how far backward and the all-reduce get in each other's way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from labutils.core.busbw import bus_factor, element_bytes
from labutils.core.inputs import LabInputError, check_choice, check_int, check_range, check_whole, safe_divide
from labutils.model.fit import MAX_WORLD_SIZE, CurvePrediction, allreduce_ms, interpolate_time_us

FIRST_BUCKET_MB = 1.0  # with its default cap, DDP puts the last layers' gradients into a small first bucket
DEFAULT_BUCKET_MB = 25.0  # DDP's default bucket_cap_mb (the lab passes None to DDP for it)


BYTES_PER_PARAM = element_bytes("float32")


def mlp_param_count(width: int, depth: int) -> int:
    """Parameters of `depth` Linear(width, width) layers with bias: depth * (width^2 + width)."""
    return depth * (width * width + width)


def mlp_gradient_bytes(width: int, depth: int) -> int:
    """Bytes all-reduced per step: 4 bytes per float32 parameter."""
    return BYTES_PER_PARAM * mlp_param_count(width, depth)


def mlp_for_gradient_bytes(target_bytes: float, depth: int = 4) -> int:
    """The width whose MLP of `depth` layers has a gradient closest to `target_bytes` (at least 8)."""
    check_range("target_bytes", target_bytes, low=1024, high=2**34, unit="bytes")
    depth = check_int("depth", depth, low=1, high=64)
    per_layer = target_bytes / BYTES_PER_PARAM / depth  # w^2 + w = per_layer
    width = (-1 + math.sqrt(1 + 4 * per_layer)) / 2
    return max(8, int(round(width)))


def ddp_bucket_sizes(param_bytes: list[int], bucket_cap_mb: float,
                     first_bucket_mb: float = FIRST_BUCKET_MB) -> list[int]:
    """The bytes of each all-reduce DDP issues per step: parameters in reverse order, packed greedily.

    The first bucket closes at `first_bucket_mb` MiB, later ones at `bucket_cap_mb` MiB: a bucket
    closes once it holds at least its cap, so a tensor larger than the cap closes the bucket it
    joins. (DDP's own packing, `_compute_bucket_assignment_by_size`, without its dtype split.)
    """
    check_range("bucket_cap_mb", bucket_cap_mb, low=0, low_open=True, unit="MiB")
    buckets: list[int] = []
    filled, cap = 0, first_bucket_mb * 2**20
    for nbytes in reversed(param_bytes):
        filled += int(nbytes)
        if filled >= cap:
            buckets.append(filled)
            filled, cap = 0, bucket_cap_mb * 2**20
    if filled:
        buckets.append(filled)
    return buckets


def _mlp_param_bytes(width: int, depth: int) -> list[int]:
    sizes = []
    for _ in range(depth):
        sizes += [BYTES_PER_PARAM * width * width, BYTES_PER_PARAM * width]
    return sizes


def first_bucket_mb(bucket_cap_mb: float) -> float:
    """The first bucket's cap (MiB): 1 MiB under DDP's default cap, else the cap itself (recent PyTorch)."""
    return FIRST_BUCKET_MB if float(bucket_cap_mb) == DEFAULT_BUCKET_MB else float(bucket_cap_mb)


def mlp_bucket_sizes(width: int, depth: int, bucket_cap_mb: float) -> list[int]:
    """`ddp_bucket_sizes` for the lab's MLP (weight then bias of each layer), first bucket `first_bucket_mb`."""
    return ddp_bucket_sizes(_mlp_param_bytes(width, depth), bucket_cap_mb, first_bucket_mb(bucket_cap_mb))


def mlp_bucket_count(width: int, depth: int, bucket_cap_mb: float) -> int:
    """How many all-reduces DDP issues per step for the lab's MLP (`mlp_bucket_sizes`)."""
    return len(mlp_bucket_sizes(width, depth, bucket_cap_mb))


def distinct_bucket_caps(width: int, depth: int, bucket_caps_mb,
                         default_cap_mb: float = DEFAULT_BUCKET_MB) -> list[float]:
    """The caps of `bucket_caps_mb` that give the model of `width` a bucket layout of its own: a cap
    whose buckets (`mlp_bucket_sizes`) equal the default cap's or an earlier cap's would measure the
    same all-reduces again, so it is left out. Order kept."""
    seen = {tuple(mlp_bucket_sizes(width, depth, default_cap_mb))}
    kept = []
    for cap in (float(c) for c in bucket_caps_mb):
        layout = tuple(mlp_bucket_sizes(width, depth, cap))
        if layout not in seen:
            seen.add(layout)
            kept.append(cap)
    return kept


def bucket_size_range(widths, depth: int, bucket_caps_mb=(),
                      default_cap_mb: float = DEFAULT_BUCKET_MB) -> tuple[int, int]:
    """(smallest, largest) all-reduce a set of runs makes, in bytes: DDP's buckets of every model
    at the default cap, of the widest at each of `bucket_caps_mb`, and each whole gradient (the
    no-overlap variant). The range an all-reduce sweep must cover to predict them all."""
    check_whole("widths", widths, low=1, high=2**20)
    if not np.size(widths):
        raise LabInputError("widths=[] is empty: give the model widths, such as [256, 512]")
    depth = check_int("depth", depth, low=1, high=1024)
    check_range("bucket_caps_mb", bucket_caps_mb, low=0, low_open=True, high=1e6, unit="MiB")
    check_range("default_cap_mb", default_cap_mb, low=0, low_open=True, high=1e6, unit="MiB")
    widths = [int(w) for w in np.atleast_1d(widths)]
    bucket_caps_mb = np.atleast_1d(np.asarray(bucket_caps_mb, dtype=float))
    sizes = [b for w in widths for b in mlp_bucket_sizes(w, depth, default_cap_mb)]
    sizes += [b for c in bucket_caps_mb for b in mlp_bucket_sizes(max(widths), depth, float(c))]
    sizes += [mlp_gradient_bytes(w, depth) for w in widths]
    return int(min(sizes)), int(max(sizes))


@dataclass(frozen=True)
class StepPrediction:
    """Estimated N-rank step (ms): `no_overlap_ms` (the sum) and `overlap_ms` (the max). Estimates
    without contention or stragglers, not bounds: a measured step may lie outside them."""

    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    comm_ms: float
    buckets: int

    @property
    def compute_ms(self) -> float:
        return self.forward_ms + self.backward_ms + self.optimizer_ms

    @property
    def no_overlap_ms(self) -> float:
        """compute + comm: nothing hidden."""
        return self.compute_ms + self.comm_ms

    @property
    def overlap_ms(self) -> float:
        """forward + max(backward, comm) + optimizer: all comm hidden behind backward if it fits."""
        return self.forward_ms + max(self.backward_ms, self.comm_ms) + self.optimizer_ms


def predict_step(single_row, world_size: int, busbw_GBps: float, alpha_us: float = 0.0,
                 buckets: int = 1) -> StepPrediction:
    """The N-rank step from a one-rank summary row (its medians) and the link's alpha and busbw."""
    comm = allreduce_ms(single_row["gradient_bytes"], world_size, busbw_GBps, alpha_us, buckets)
    return StepPrediction(float(single_row["forward_ms"]), float(single_row["backward_ms"]),
                          float(single_row["optimizer_ms"]), float(comm), int(buckets))


def bucket_comm_ms(sweep: pd.DataFrame, bucket_bytes) -> tuple[float, CurvePrediction]:
    """The all-reduce time of a step's buckets read off the measured sweep, in ms: the sum over
    buckets of the measured curve interpolated at each bucket's size (`fit.interpolate_time_us`).
    The sweep must have run on the step's rank count. Returns (ms, the per-bucket reading)."""

    reading = interpolate_time_us(sweep, list(bucket_bytes))
    return float(np.sum(reading.time_us)) / 1e3, reading


def is_between(measured_ms: float, prediction: StepPrediction) -> bool:
    """Ideal overlap <= measured <= no overlap: the step lies between its two estimates (ties inside)."""
    return prediction.overlap_ms <= measured_ms <= prediction.no_overlap_ms


def position(measured_ms: float, overlap_ms: float, no_overlap_ms: float) -> str:
    """Where a measured step lies against its estimates: "below" the ideal-overlap one, "between"
    the two (an estimate equal to the measurement counts as between), or "above" the no-overlap one."""
    if measured_ms < overlap_ms:
        return "below"
    return "above" if measured_ms > no_overlap_ms else "between"


def estimate_compute(route) -> str:
    """Where the estimates take compute from on `route` (a machine.Route): "n_rank" (the N-rank run's
    own backward without sync) when ranks share a GPU, whose compute then runs at a fraction of
    the one-rank speed; else "one_rank" (a true prediction from one rank)."""
    return "n_rank" if getattr(route, "shares_gpu", False) else "one_rank"


def between_estimates_figure(table: pd.DataFrame) -> str:
    """"k/n": of the n DDP runs with default buckets in a `prediction_table`, k lay between the two estimates."""
    ddp = table[(table["mode"] == "ddp") & (table["bucket_cap_mb"] == DEFAULT_BUCKET_MB)]
    return f"{int(ddp['between'].sum())}/{len(ddp)}"


def _check_latency(alpha_us, buckets) -> None:
    check_range("alpha_us", alpha_us, low=0, high=math.inf, high_open=True, unit="us")
    check_whole("buckets", buckets, low=1, high=MAX_WORLD_SIZE, unit="all-reduces")


def predicted_efficiency(gradient_bytes, busbw_GBps, compute_ms, world_size, alpha_us=0.0, buckets=1,
                         hideable=0.0, scaling="weak"):
    """Predicted scaling efficiency (0..1) of an N-rank data-parallel step; numpy-vectorised.

    `compute_ms` is the one-rank step at the per-rank batch (weak) or at the global batch
    (strong: each rank then computes compute_ms / N). A share `hideable` (0..1) of the compute,
    the backward pass, can hide communication: T_N = (1 - h) c + max(h c, comm).
    weak: efficiency = compute_ms / T_N;  strong: efficiency = compute_ms / (N T_N).
    hideable=0 is the no-overlap estimate (the sum), hideable=1 the ideal-overlap one (the max).
    """
    check_range("compute_ms", compute_ms, low=0, low_open=True, high=math.inf, high_open=True, unit="ms")
    check_range("hideable", hideable, low=0, high=1)
    check_whole("world_size", world_size, low=1, high=MAX_WORLD_SIZE, unit="ranks")
    check_range("gradient_bytes", gradient_bytes, low=0, high=math.inf, high_open=True, unit="bytes")
    check_range("busbw_GBps", busbw_GBps, low=0, high=math.inf, high_open=True, unit="GB/s")  # 0: no link, "never"
    check_choice("scaling", scaling, ("weak", "strong"))
    n = np.asarray(world_size, dtype=float)
    c = np.asarray(compute_ms, dtype=float) / (n if scaling == "strong" else 1.0)
    h = np.asarray(hideable, dtype=float)
    comm = allreduce_ms(gradient_bytes, n, busbw_GBps, alpha_us, buckets)
    t_n = (1 - h) * c + np.maximum(h * c, comm)
    eff = np.asarray(compute_ms, float) / ((n if scaling == "strong" else 1.0) * t_n)
    return float(eff) if np.ndim(eff) == 0 else eff


def min_busbw_for_efficiency(gradient_bytes, compute_ms, world_size, efficiency=0.9, alpha_us=0.0, buckets=1):
    """Smallest bus bandwidth (GB/s) for a weak-scaling efficiency without overlap, or inf ("never").

    E = c / (c + comm)  =>  comm <= c (1/E - 1); the wire part 2(N-1)/N V / (B 1e6) must fit in what
    is left after the latency, so B >= 2(N-1)/N V / (1e6 (c (1/E - 1) - buckets alpha / 1e3)).
    """
    check_range("efficiency", efficiency, low=0, high=1, low_open=True)
    check_range("gradient_bytes", gradient_bytes, low=0, high=math.inf, high_open=True, unit="bytes")
    check_range("compute_ms", compute_ms, low=0, low_open=True, high=math.inf, high_open=True, unit="ms")
    _check_latency(alpha_us, buckets)
    room_ms = np.asarray(compute_ms, float) * (1 / np.asarray(efficiency, float) - 1) \
        - np.asarray(buckets, float) * np.asarray(alpha_us, float) / 1e3
    need = bus_factor("all_reduce", world_size) * np.asarray(gradient_bytes, float) / 1e6
    bw = safe_divide(need, room_ms)
    bw = np.where(need == 0, 0.0, bw)
    return float(bw) if bw.ndim == 0 else bw


def max_hidden_gradient_bytes(backward_ms, busbw_GBps, world_size, alpha_us=0.0, buckets=1):
    """The largest gradient whose all-reduce fits behind the backward pass (ideal overlap), bytes.

    comm = buckets alpha + 2(N-1)/N V / (B 1e6) <= backward
    =>  V <= (backward - buckets alpha / 1e3) B 1e6 / (2(N-1)/N).
    Unlimited (inf) for N = 1; 0 when the latencies alone outlast backward.
    """
    check_range("backward_ms", backward_ms, low=0, high=math.inf, high_open=True, unit="ms")
    check_range("busbw_GBps", busbw_GBps, low=0, low_open=True, high=math.inf, high_open=True, unit="GB/s")
    _check_latency(alpha_us, buckets)
    room_ms = np.maximum(0.0, np.asarray(backward_ms, float)
                         - np.asarray(buckets, float) * np.asarray(alpha_us, float) / 1e3)
    factor = bus_factor("all_reduce", world_size)
    out = safe_divide(room_ms * np.asarray(busbw_GBps, float) * 1e6, factor)
    return float(out) if out.ndim == 0 else out

