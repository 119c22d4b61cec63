"""How an all-reduce is timed and its busbw measured, inside every rank (notebook 02).

Read `time_one_allreduce` first: warm up, line the ranks up, start the clock, loop, wait for the
device, divide. busbw then follows from the time (labutils.core.busbw):

    algbw = size_bytes / time;  busbw = algbw * 2(N-1)/N  for all_reduce on N ranks

`measure` is what the sweep really runs; it adds blocks (the median block is kept), an
iteration count rank 0 picks and broadcasts (every rank must make the same calls), and the mean
and slowest rank. `sweep_worker` loops over ops and sizes and checks every result
(labutils.measure.buffers.count_wrong). The sweep is launched by labutils.measure.sweep.
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

from labutils.core.busbw import REDOPS, ROOTS, Layout, bandwidths_GBps, layout
from labutils.measure.buffers import collective_call, count_wrong, make_buffers
from labutils.measure.timing import across_ranks, agree_iters, barrier, time_loop


def time_one_allreduce(ctx, size_bytes: int, iters: int = 20, warmup: int = 5) -> float:
    """Milliseconds per all_reduce of `size_bytes` (float32) in this rank: the plain recipe.

    1. warm up (the first calls set up connections and buffers; never timed);
    2. barrier, so every rank starts the clock together;
    3. clock, loop `iters` calls, and wait for the device to finish (CUDA runs asynchronously);
    4. divide the elapsed time by `iters`.
    Run it in every rank with labutils.measure.launch.launch (notebook 02 shows it first).
    """
    buf = torch.zeros(max(1, size_bytes // 4), dtype=torch.float32, device=ctx.device)
    for _ in range(warmup):
        dist.all_reduce(buf)
    barrier(ctx.device)  # waits for the warm-up, and names this rank's GPU to NCCL
    if ctx.device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    if ctx.device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e3


def warmup_iters(size_bytes: int, warmup: int) -> int:
    """Warm-up calls for a size: `warmup` up to 4 MiB, fewer (at least 1) above.

    A pure function of the size, so every rank agrees without asking.
    """
    if warmup <= 0:
        return 0
    return max(1, min(warmup, warmup * (4 << 20) // max(1, size_bytes)))


BLOCKS = 5  # timed blocks per size; the median block is kept


def measure(lay: Layout, ctx, warmup: int, budget_ms: float, min_iters: int, max_iters: int) -> dict:
    """Time one size: warm-up, probe, agreed iterations, timed blocks; mean and slowest rank.

    The agreed iterations run as up to BLOCKS back-to-back blocks, each timed between
    synchronised clocks; a rank's time per call is its median block (one block stretched by
    another program on a shared machine does not move it). `time_us` is the mean of that over
    ranks (nccl-tests' default), `time_max_us` the slowest rank.
    """
    inp, out = make_buffers(lay, ctx.rank, ctx.device, filled=False)
    call = collective_call(lay, inp, out)
    for _ in range(warmup_iters(lay.size_bytes, warmup)):
        call()
    probe_ms = time_loop(call, 2, ctx.device)
    iters = agree_iters(probe_ms, budget_ms, min_iters, max_iters, ctx.device)
    blocks = min(BLOCKS, iters)
    per_block = math.ceil(iters / blocks)
    ms = statistics.median(time_loop(call, per_block, ctx.device) for _ in range(blocks))
    stats = across_ranks(ms, ctx.device)
    return {"time_us": stats.mean * 1e3, "time_max_us": stats.max * 1e3, "iters": blocks * per_block}


def sweep_row(lay: Layout, timing: dict, wrong: int, ctx, warmup: int) -> dict:
    algbw, busbw = bandwidths_GBps(lay.op, lay.size_bytes, timing["time_us"], lay.world_size)
    _, slowest = bandwidths_GBps(lay.op, lay.size_bytes, timing["time_max_us"], lay.world_size)
    return {"op": lay.op, "size_bytes": lay.size_bytes, "count": lay.count, "dtype": lay.dtype,
            "redop": REDOPS[lay.op], "root": ROOTS[lay.op], "time_us": timing["time_us"],
            "algbw_GBps": algbw, "busbw_GBps": busbw, "wrong": wrong, "world_size": lay.world_size,
            "backend": ctx.backend, "in_place": lay.op in ("all_reduce", "broadcast"),
            "device": "cuda" if ctx.device.startswith("cuda") else "cpu", "time_max_us": timing["time_max_us"],
            "busbw_slowest_GBps": slowest, "iters": timing["iters"], "warmup": warmup_iters(lay.size_bytes, warmup)}


def warm_up_op(op: str, sizes, dtype: str, ctx, warmup: int) -> None:
    """Untimed calls at the largest then the smallest size before an op's sweep, as nccl-tests
    does: connections, buffers and code paths are set up before the first size is timed."""
    for size in (sizes[-1], sizes[0]):
        lay = layout(op, size, dtype, ctx.world_size)
        if lay is None:
            continue
        inp, out = make_buffers(lay, ctx.rank, ctx.device, filled=False)
        call = collective_call(lay, inp, out)
        for _ in range(warmup_iters(size, warmup)):
            call()


def sweep_worker(ctx, ops, sizes, dtype="float32", warmup=5, budget_ms=100.0, min_iters=3, max_iters=1000,
                 check=True) -> list[dict]:
    """Run in every rank: for each op and size, measure then check; returns the rows (same on all ranks)."""
    rows = []
    plan = [(op, s) for op in ops for s in sizes]
    for i, (op, size) in enumerate(plan):
        if size == sizes[0]:
            warm_up_op(op, sizes, dtype, ctx, warmup)
        lay = layout(op, size, dtype, ctx.world_size)
        if lay is not None:
            timing = measure(lay, ctx, warmup, budget_ms, min_iters, max_iters)
            wrong = count_wrong(lay, ctx) if check else 0
            rows.append(sweep_row(lay, timing, wrong, ctx, warmup))
        if ctx.rank == 0:
            ctx.report({"done": i + 1, "of": len(plan), "op": op, "size_bytes": size})
    return rows
