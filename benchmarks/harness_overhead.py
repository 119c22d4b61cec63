"""Is the sweep harness honest and fast enough? Three targets, every figure printed.

1. Overhead: on the same 2 gloo ranks and sizes, the harness's busbw against a bare
   `dist.all_reduce` loop timed with perf_counter: ratio >= 0.97 from 1 MiB up.
2. Speed: a full gloo all_reduce sweep 1 KiB .. 64 MiB on 2 ranks within 30 s (spawn included).
3. Model: the (alpha, beta) fit of that sweep predicts held-out sizes with median error < 15%.

    .venv/bin/python benchmarks/harness_overhead.py

Exit status 1 when a target is missed. Timings depend on what else the machine is doing.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labutils.core.busbw import (  # noqa: E402
    bandwidths_GBps,
    format_nccl_table,
    format_size,  # noqa: E402
    layout,
    sweep_sizes,
)
from labutils.measure.harness import measure, warmup_iters  # noqa: E402
from labutils.measure.pool import launch  # noqa: E402
from labutils.measure.sweep import run_sweep  # noqa: E402
from labutils.measure.timing import across_ranks, barrier  # noqa: E402
from labutils.model.fit import fit_alpha_beta  # noqa: E402

RATIO_FROM_BYTES = 1 << 20


def overhead_worker(ctx, sizes, budget_ms=100.0, rounds=3, warmup=5) -> list[dict]:
    """Run in every rank (spawned from this script, which is importable as `__mp_main__`): the
    harness's `measure` against a bare `dist.all_reduce` loop, per size.

    Both run `rounds` times, alternating which goes first, with the same iteration count; each
    keeps its fastest round (as timeit does: noise from other work only ever adds time, so the
    minimum is the steadiest estimate of what each loop costs). Returns size_bytes, harness_us,
    bare_us (mean over ranks), iters.
    """
    import torch
    import torch.distributed as dist

    rows = []
    for size in sizes:
        lay = layout("all_reduce", size, "float32", ctx.world_size)
        harness, bare, iters = [], [], 1
        buf = torch.zeros(lay.count, device=ctx.device)
        for r in range(rounds):
            for which in (("harness", "bare") if r % 2 == 0 else ("bare", "harness")):
                if which == "harness":
                    timing = measure(lay, ctx, warmup, budget_ms, 3, 1000)
                    harness.append(timing["time_us"])
                    iters = timing["iters"]
                    continue
                for _ in range(warmup_iters(size, warmup)):
                    dist.all_reduce(buf)
                barrier(ctx.device)
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(buf)
                bare.append(across_ranks((time.perf_counter() - start) / iters * 1e6, ctx.device).mean)
        rows.append({"size_bytes": lay.size_bytes, "harness_us": min(harness), "bare_us": min(bare),
                     "iters": iters})
        if ctx.rank == 0:
            ctx.report({"done": len(rows), "of": len(sizes)})
    return rows


def harness_vs_bare(device: str = "cpu", backend: str = "gloo", nproc: int = 2, min_bytes="1K", max_bytes="64M",
                    factor: int = 4, budget_ms: float = 400, rounds: int = 9, timeout_s: float = 600) -> list[dict]:
    """The harness's all_reduce against a bare `dist.all_reduce` loop on the same ranks and sizes
    (`overhead_worker` above), on `device` tensors. One row per size: harness_us,
    bare_us, iters, ratio = bare_us / harness_us (the busbw ratio harness / bare) and both busbw
    in decimal GB/s."""
    sizes = sweep_sizes(min_bytes, max_bytes, factor)
    rows = launch(overhead_worker, nproc, kwargs={"sizes": sizes, "budget_ms": budget_ms, "rounds": rounds},
                  backend=backend, device=device, timeout_s=timeout_s)[0]
    return [{**r, "ratio": r["bare_us"] / r["harness_us"],
             "busbw_GBps": bandwidths_GBps("all_reduce", r["size_bytes"], r["harness_us"], nproc)[1],
             "bare_busbw_GBps": bandwidths_GBps("all_reduce", r["size_bytes"], r["bare_us"], nproc)[1]}
            for r in rows]


def format_comparison(rows: list[dict]) -> str:
    """The rows of `harness_vs_bare` as a table."""
    lines = [f"{'size':>8}  {'iters':>5}  {'harness us':>11}  {'bare us':>11}  {'busbw GB/s':>10}  {'busbw ratio':>11}"]
    lines += [f"{format_size(r['size_bytes']):>8}  {r['iters']:>5}  {r['harness_us']:>11.1f}  {r['bare_us']:>11.1f}  "
              f"{r['busbw_GBps']:>10.3f}  {r['ratio']:>11.3f}" for r in rows]
    return "\n".join(lines)


def min_ratio(rows: list[dict], from_bytes: int = RATIO_FROM_BYTES) -> float:
    """The smallest harness / bare busbw ratio from `from_bytes` up (nan when no size is that large)."""
    ratios = [r["ratio"] for r in rows if r["size_bytes"] >= from_bytes]
    return min(ratios) if ratios else float("nan")


def main() -> int:
    results = {}
    rows = harness_vs_bare("cpu", "gloo", 2, "1K", "64M", factor=4, budget_ms=400, rounds=9)
    print("1. harness vs bare dist.all_reduce loop (gloo, 2 ranks, fastest of 9 alternating rounds)")
    print(format_comparison(rows))
    worst = min_ratio(rows)
    results["overhead: min busbw ratio from 1 MiB up >= 0.97"] = (worst, worst >= 0.97)

    started = time.perf_counter()
    sweep = run_sweep(nproc=2, backend="gloo", min_bytes="1K", max_bytes="64M", budget_ms=100, progress=False)
    wall_s = time.perf_counter() - started
    print("\n2. full sweep")
    print(format_nccl_table(sweep.frame, sweep.meta))
    results["speed: 1 KiB..64 MiB sweep on 2 ranks, seconds <= 30"] = (wall_s, wall_s <= 30)

    fit = fit_alpha_beta(sweep.frame)
    print(f"\n3. fit: alpha = {fit.alpha_us:.1f} us, busbw = {fit.busbw_GBps:.3f} GB/s, "
          f"held-out median error {100 * fit.heldout_median_error:.1f}%, max {100 * fit.heldout_max_error:.1f}%")
    results["model: held-out median relative error < 0.15"] = (fit.heldout_median_error,
                                                               fit.heldout_median_error < 0.15)
    print()
    for name, (value, ok) in results.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {value:.3f}")
    return 0 if all(ok for _, ok in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
