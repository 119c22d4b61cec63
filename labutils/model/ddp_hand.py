"""Data parallelism by hand, the arithmetic (notebook 11): which all-reduces each of the four ways
makes per step, their estimated step times, and what a rank holds for DDP and for the sharded step.
Pure functions: no torch, no launcher. Bytes, ms, decimal GB/s.

The four ways, for the lab's MLP (`ddp_model`: depth x [weight w x w, bias w], float32):

- "per_parameter": after backward, one all-reduce per parameter tensor (2 x depth of them);
- "flat":          after backward, one all-reduce of every gradient in one buffer;
- "overlapped":    one all-reduce per parameter, launched while backward runs;
- "bucketed":      parameters packed in reverse order into buckets that close once they hold
                   `bucket_mb` MiB (DDP's packing, `ddp_model.ddp_bucket_sizes`, with an explicit cap
                   for the first bucket too), one all-reduce per bucket launched while backward runs.

Each all-reduce costs alpha + 2(N-1)/N x bytes / busbw (`fit.allreduce_ms`, one per call), so

    comm = sum over the way's all-reduces of (alpha + 2(N-1)/N x bytes / busbw)
    no-overlap estimate    = forward + backward + comm + optimizer
    ideal-overlap estimate = forward + max(backward, comm) + optimizer   (the ways that launch during backward)

and for the two ways that wait for backward to end the two estimates are the same sum. They are
estimates, not bounds: neither holds contention between backward and the all-reduces, nor waits for
a slower rank.

Memory per rank (float32, P parameters, N ranks, the sharded step's flat buffer padded to
N x ceil(P / N) elements so that it splits evenly):

    DDP:      parameters 4P, gradients 4P, Adam moments 2 x 4P
    sharded:  parameters 4 N ceil(P/N) (every rank still holds the whole model), gradients
              4 ceil(P/N) (the reduce-scattered shard kept for the update), Adam moments 2 x 4 ceil(P/N)
"""

from __future__ import annotations

import math

import pandas as pd

from labutils.core.inputs import check_choice, check_int, check_number
from labutils.model.ddp_model import BYTES_PER_PARAM, ddp_bucket_sizes
from labutils.model.fit import MAX_WORLD_SIZE, allreduce_ms

WAYS = ("per_parameter", "flat", "overlapped", "bucketed")
OVERLAPPING = ("overlapped", "bucketed", "ddp")  # launched while backward runs: backward can hide them


def way_allreduce_bytes(way: str, width: int, depth: int, bucket_mb: float = 1.0) -> list[int]:
    """The bytes of each all-reduce `way` makes per step, in the order it makes them ("ddp": torch's
    buckets at the same cap, as "bucketed"). Parameters in `model.parameters()` order for
    "per_parameter"; backward's order (the reverse) for "overlapped" and the buckets."""
    check_choice("way", way, (*WAYS, "ddp"))
    w, d = check_int("width", width, low=1, high=2**16), check_int("depth", depth, low=1, high=1024)
    bucket_mb = check_number("bucket_mb", bucket_mb, low=0, low_open=True, high=1e6, unit="MiB")
    sizes = [BYTES_PER_PARAM * n for _ in range(d) for n in (w * w, w)]  # model.parameters(): weight, bias
    if way == "per_parameter":
        return sizes
    if way == "flat":
        return [sum(sizes)]
    if way == "overlapped":
        return sizes[::-1]
    return ddp_bucket_sizes(sizes, bucket_mb, first_bucket_mb=bucket_mb)


def way_comm_ms(way: str, width: int, depth: int, bucket_mb: float, world_size: int, busbw_GBps: float,
                alpha_us: float) -> float:
    """The way's all-reduces on the link: the sum of alpha + 2(N-1)/N x bytes / busbw, one per call (ms)."""
    return float(sum(allreduce_ms(s, world_size, busbw_GBps, alpha_us)
                     for s in way_allreduce_bytes(way, width, depth, bucket_mb)))


def step_estimates_ms(way: str, forward_ms: float, backward_ms: float, optimizer_ms: float,
                      comm_ms: float) -> tuple[float, float]:
    """(no-overlap, ideal-overlap) estimates of the way's step (ms): the sum, and for the ways that
    launch during backward forward + max(backward, comm) + optimizer (for the others the sum again)."""
    no_overlap = forward_ms + backward_ms + comm_ms + optimizer_ms
    if way not in OVERLAPPING:
        return no_overlap, no_overlap
    return no_overlap, forward_ms + max(backward_ms, comm_ms) + optimizer_ms


def shard_elements(param_count: int, world_size: int) -> int:
    """Elements of one rank's shard: ceil(P / N) (the flat buffer is padded to N of them)."""
    return math.ceil(check_int("param_count", param_count, low=1) / check_int("world_size", world_size, low=1))


def memory_bytes(param_count: int, world_size: int, sharded: bool) -> dict[str, int]:
    """What one rank holds (bytes) for plain DDP with Adam, or for the sharded step (module docstring)."""
    p, b = int(param_count), BYTES_PER_PARAM
    if not sharded:
        return {"parameters": b * p, "gradients": b * p, "Adam moments": 2 * b * p}
    k = shard_elements(p, world_size)
    return {"parameters": b * k * int(world_size), "gradients": b * k, "Adam moments": 2 * b * k}


def memory_table(param_count: int, world_size: int) -> pd.DataFrame:
    """Bytes per rank, DDP against the sharded step, one row per kind and a total; `sharded / DDP`."""
    param_count = check_int("param_count", param_count, low=1, high=10**15)
    world_size = check_int("world_size", world_size, low=1, high=MAX_WORLD_SIZE)
    ddp, zero = memory_bytes(param_count, world_size, False), memory_bytes(param_count, world_size, True)
    table = pd.DataFrame({"DDP (bytes)": ddp, "sharded (bytes)": zero})
    table.loc["total"] = table.sum()
    table["sharded / DDP"] = table["sharded (bytes)"] / table["DDP (bytes)"]
    return table
