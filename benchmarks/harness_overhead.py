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

from labutils.collectives import overhead_worker, run_sweep, sweep_sizes  # noqa: E402
from labutils.fit import fit_alpha_beta  # noqa: E402
from labutils.launch import launch  # noqa: E402
from labutils.nccl_tests import format_table  # noqa: E402
from labutils.units import format_size  # noqa: E402


def main() -> int:
    results = {}
    sizes = sweep_sizes("1K", "64M", 4)
    rows = launch(overhead_worker, 2, kwargs={"sizes": sizes, "budget_ms": 400, "rounds": 9}, timeout_s=600)[0]
    print("1. harness vs bare dist.all_reduce loop (gloo, 2 ranks, fastest of 9 alternating rounds)")
    print(f"{'size':>8}  {'iters':>5}  {'harness us':>11}  {'bare us':>11}  {'busbw ratio':>11}")
    ratios = []
    for r in rows:
        ratio = r["bare_us"] / r["harness_us"]  # busbw ratio = inverse time ratio
        print(f"{format_size(r['size_bytes']):>8}  {r['iters']:>5}  {r['harness_us']:>11.1f}  {r['bare_us']:>11.1f}  "
              f"{ratio:>11.3f}")
        if r["size_bytes"] >= 1 << 20:
            ratios.append(ratio)
    results["overhead: min busbw ratio from 1 MiB up >= 0.97"] = (min(ratios), min(ratios) >= 0.97)

    started = time.perf_counter()
    sweep = run_sweep(nproc=2, backend="gloo", min_bytes="1K", max_bytes="64M", budget_ms=100, progress=False)
    wall_s = time.perf_counter() - started
    print("\n2. full sweep")
    print(format_table(sweep.frame, sweep.meta))
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
