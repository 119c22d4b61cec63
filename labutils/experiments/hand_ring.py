"""The ring all-reduce by hand, for real (notebook 04): the algorithm of `labutils.model.ring` with
torch.distributed point-to-point `isend`/`recv` on N ranks (gloo on the CPU), checked element by
element against `dist.all_reduce` on the same data and timed against it.

`hand_ring_all_reduce` is the algorithm in a dozen lines; `ring_worker` runs in each rank;
`run_hand_ring` launches the ranks and returns one row per size; `ratio_sentence` says what the
timed rows show.
"""

from __future__ import annotations

import statistics

import pandas as pd
import torch
import torch.distributed as dist

from labutils.core.busbw import bandwidths_GBps, canonical_dtype, element_bytes, format_size, layout
from labutils.core.inputs import check_int, check_range
from labutils.measure.buffers import expected, fill
from labutils.measure.harness import warmup_iters
from labutils.measure.launch import default_threads
from labutils.measure.pool import shared_pool
from labutils.measure.timing import across_ranks, agree_iters, time_loop

# --- 4. the real thing ---------------------------------------------------------------------------

def hand_ring_all_reduce(t) -> None:
    """Sum `t` (a contiguous 1-D tensor) over all ranks, in place, as a ring of point-to-point messages.

    Reduce-scatter then all-gather, the schedule of `ring_schedule`: each step posts a
    non-blocking `isend` to the right neighbour and a blocking `recv` from the left one, so no
    rank waits for a send that nobody receives yet. Every rank must call it with a tensor of
    the same length (chunks are cut as torch.tensor_split cuts them; empty chunks are skipped
    on both sides alike).
    """
    n, r = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return
    chunks = list(torch.tensor_split(t, n))
    right, left = (r + 1) % n, (r - 1) % n
    scratch = torch.empty_like(chunks[0])
    for s in range(n - 1):  # reduce-scatter: receive into scratch, add
        send, recv = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        if send.numel():
            request = dist.isend(send, right)
        if recv.numel():
            dist.recv(scratch[:recv.numel()], left)
            recv.add_(scratch[:recv.numel()])
        if send.numel():
            request.wait()
    for s in range(n - 1):  # all-gather: receive straight into place
        send, recv = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        if send.numel():
            request = dist.isend(send, right)
        if recv.numel():
            dist.recv(recv, left)
        if send.numel():
            request.wait()


def _compare_with_all_reduce(count: int, dtype: str, ctx) -> int:
    """Elements (summed over ranks) where the hand ring differs from dist.all_reduce on the same
    input, or from the exact expected sum."""
    mine = fill(ctx.rank, count, dtype, ctx.device)
    theirs = mine.clone()
    hand_ring_all_reduce(mine)
    dist.all_reduce(theirs)
    exact = expected(layout("all_reduce", count * mine.element_size(), dtype, ctx.world_size), ctx.rank, ctx.device)
    wrong = torch.tensor([int(((mine != theirs) | (mine != exact)).sum().item())], dtype=torch.int64,
                         device=ctx.device)
    dist.all_reduce(wrong)
    return int(wrong.item())


def ring_worker(ctx, sizes, dtype: str = "float32", budget_ms: float = 40.0, warmup: int = 2,
                rounds: int = 3, time_it: bool = True) -> list[dict]:
    """Run in every rank: per size, check the hand ring against dist.all_reduce, then time both.

    Timing: warm-up calls, a probe from which rank 0 picks the iteration count (harness.
    agree_iters, broadcast), then `rounds` rounds alternating which of the two goes first, each a
    timed loop between synchronised clocks (timing.time_loop); each keeps its median round and
    the mean over ranks (timing.across_ranks). Returns the same rows on every rank.
    """
    rows = []
    for size in sizes:
        count = max(ctx.world_size, int(size) // element_bytes(dtype))
        wrong = _compare_with_all_reduce(count, dtype, ctx)
        row = {"size_bytes": count * element_bytes(dtype), "count": count, "world_size": ctx.world_size,
               "backend": ctx.backend, "wrong": wrong}
        if time_it:
            buf = torch.zeros(count, dtype=getattr(torch, dtype), device=ctx.device)
            calls = {"hand_ring": lambda: hand_ring_all_reduce(buf), "all_reduce": lambda: dist.all_reduce(buf)}  # noqa: B023
            for call in calls.values():
                for _ in range(max(1, warmup_iters(row["size_bytes"], warmup))):
                    call()
            probe = max(time_loop(call, 1, ctx.device) for call in calls.values())
            iters = agree_iters(probe, budget_ms / (2 * rounds), 1, 500, ctx.device)
            times = {name: [] for name in calls}
            for k in range(rounds):
                order = list(calls) if k % 2 == 0 else list(calls)[::-1]
                for name in order:
                    times[name].append(time_loop(calls[name], iters, ctx.device))
            for name, samples in times.items():
                row[f"{name}_us"] = across_ranks(statistics.median(samples), ctx.device).mean * 1e3
            row["iters"] = iters
        rows.append(row)
        if ctx.rank == 0:
            ctx.report({"done": len(rows), "of": len(sizes)})
    return rows


def run_hand_ring(sizes=(4096, 262144, 4 << 20), nproc: int = 4, dtype: str = "float32", budget_ms: float = 40.0,
                  time_it: bool = True, backend: str = "gloo", device: str = "cpu",
                  timeout_s: float | None = None) -> pd.DataFrame:
    """Launch `ring_worker` on `nproc` local ranks; one row per size with the check and both times.

    Columns: size_bytes, count, world_size, backend, wrong (must be 0), and when timed
    hand_ring_us, all_reduce_us, iters, ratio (hand / library), and each one's busbw in GB/s.
    """
    nproc = check_int("nproc", nproc, low=2)
    dtype = canonical_dtype(dtype)
    sizes = [check_int("size_bytes", int(s), low=1) for s in sizes]
    check_range("budget_ms", budget_ms, low=0, low_open=True, unit="ms")
    timeout_s = timeout_s or 60.0 + len(sizes) * (4 * budget_ms / 1e3 + 5.0)
    pool = shared_pool(nproc, backend, device, threads_per_rank=default_threads(nproc))
    rows = pool.run(ring_worker, kwargs={"sizes": sizes, "dtype": dtype, "budget_ms": budget_ms, "time_it": time_it},
                    timeout_s=timeout_s)[0]
    frame = pd.DataFrame(rows)
    if time_it and len(frame):
        frame["ratio"] = frame["hand_ring_us"] / frame["all_reduce_us"]
        for name in ("hand_ring", "all_reduce"):
            frame[f"{name}_busbw_GBps"] = [bandwidths_GBps("all_reduce", s, t, nproc)[1]
                                           for s, t in zip(frame["size_bytes"], frame[f"{name}_us"])]
    return frame


def ratio_sentence(frame: pd.DataFrame, rel_tol: float = 0.1) -> str:
    """What the timed rows of `run_hand_ring` show, from their numbers: the ratio hand ring / library
    time at each size, then at which sizes the hand ring was slower, about as fast (within
    `rel_tol`, 10 %: four processes on shared cores time no closer) or faster."""
    rows = frame.sort_values("size_bytes")
    listed = ", ".join(f"{r:.2f} at {format_size(s)}" for s, r in zip(rows["size_bytes"], rows["ratio"]))
    kinds = [f"about as fast (within {rel_tol:.0%})" if abs(r - 1) <= rel_tol else ("slower" if r > 1 else "faster")
             for r in rows["ratio"]]
    groups = []
    for size, kind in zip(rows["size_bytes"], kinds):
        if groups and groups[-1][0] == kind:
            groups[-1][1].append(size)
        else:
            groups.append((kind, [size]))
    said = "; ".join(f"{kind} at {format_size(g[0])}" + (f" to {format_size(g[-1])}" if len(g) > 1 else "")
                     for kind, g in groups)
    library = f"{rows['backend'].iloc[0]}'s" if "backend" in rows else "the library's"
    return f"Hand ring time over {library} all_reduce time: {listed}. The hand ring was {said}."
