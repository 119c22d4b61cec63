"""Each notebook's seconds on this machine against what the run-time model predicts for it.

    .venv/bin/python benchmarks/notebook_run_time.py                 # 09 and 10, full mode
    .venv/bin/python benchmarks/notebook_run_time.py --only 00,05,09 --quick

First this machine is measured, as labutils.model.run_time.Machine describes one: the fp32 GEMM
rate of one rank's device (one core at one thread on the CPU route, labutils.measure.compute_rate),
the saved link of 2 ranks (alpha, busbw; a sweep when none is saved), the start-up of one set of
2 ranks (spawn to the first all-reduce), and a kernel's start with the imports (notebook 05, which
measures nothing: its seconds less its figures, `--kernel-s` to give it). Then the notebooks run
as `make run` runs them (the runner, into a temporary folder), and each one's seconds are printed
beside the prediction, PASS when within `--tolerance` (30 %). The figures depend on how busy the
machine is: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labutils.course.plans import notebook_plan  # noqa: E402
from labutils.course.runner import find_notebooks, notebook_parameters, run_notebooks  # noqa: E402
from labutils.measure.compute_rate import measure_flops_per_s  # noqa: E402
from labutils.measure.launch import cuda_device_count, free_memory_bytes, ping_worker, resolve_backend  # noqa: E402
from labutils.measure.pool import shared_pool, stop_shared_pool  # noqa: E402
from labutils.measure.sweep import ensure_link  # noqa: E402
from labutils.model.run_time import Machine, predict  # noqa: E402


def measure_machine(kernel_s: float | None, out: Path) -> Machine:
    """This machine's Machine: rates measured now, the link saved (or measured), start-up timed."""
    choice = resolve_backend("auto", "auto", 2)
    start = time.perf_counter()
    shared_pool(2, choice.backend, choice.device, 1).run(ping_worker, timeout_s=120)  # one thread per rank, as 10
    startup_s = time.perf_counter() - start
    rate = measure_flops_per_s(2, choice.backend, choice.device, 1)
    stop_shared_pool()
    link = ensure_link(2, choice.backend, choice.device, quick=False)
    gpus = cuda_device_count()
    if kernel_s is None:
        run_notebooks("05", quick=False, out_dir=out / "kernel")
        seconds = json.loads((out / "kernel" / "summary.json").read_text())["notebooks"]
        kernel_s = max(0.5, next(iter(seconds.values()))["seconds"] - 3 * 0.4 - 0.5)
    return Machine("this machine", cores=os.cpu_count() or 1, gpus=gpus, flops_per_s=rate, alpha_us=link.alpha_us,
                   busbw_GBps=link.busbw_GBps, memory_bytes=free_memory_bytes(choice.device, 2), startup_s=startup_s,
                   kernel_s=kernel_s)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="09,10", help="notebooks to run, as run-notebooks --only (default 09,10)")
    parser.add_argument("--quick", action="store_true", help="quick mode instead of full mode")
    parser.add_argument("--kernel-s", type=float, default=None, help="a kernel's start and imports, seconds")
    parser.add_argument("--tolerance", type=float, default=0.30,
                        help="largest accepted |measured - predicted| / predicted")
    args = parser.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="notebook-run-time-"))
    machine = measure_machine(args.kernel_s, out)
    print(f"this machine: {machine.cores} cores, {machine.gpus} GPU(s), "
          f"{machine.flops_per_s / 1e9:.3g} GFLOP/s per rank, "
          f"link alpha {machine.alpha_us:.0f} us busbw {machine.busbw_GBps:.3g} GB/s, rank start-up "
          f"{machine.startup_s:.1f} s, kernel {machine.kernel_s:.1f} s; load average {os.getloadavg()[0]:.2f}")
    paths = find_notebooks(args.only)
    params = {p.stem: {**notebook_parameters(p), "quick": args.quick} for p in paths}
    predicted = {name: predict(machine, notebook_plan(name, machine, p)) for name, p in params.items()}
    run_notebooks(args.only, quick=args.quick, out_dir=out / "run")
    measured = json.loads((out / "run" / "summary.json").read_text())["notebooks"]
    failed = 0
    print(f"{'notebook':28} {'measured s':>10} {'predicted s':>11} {'error':>7}  verdict")
    for name, pred in predicted.items():
        got = measured.get(name, {})
        seconds = got.get("seconds") if got.get("ok") else None
        if seconds is None:
            print(f"{name:28} {'failed':>10} {pred.total_s:11.1f} {'':>7}  FAIL ({got.get('error')})")
            failed += 1
            continue
        error = (seconds - pred.total_s) / pred.total_s
        ok = abs(error) <= args.tolerance
        failed += not ok
        print(f"{name:28} {seconds:10.1f} {pred.total_s:11.1f} {error:+7.0%}  {'PASS' if ok else 'FAIL'}")
        print("    predicted: " + ", ".join(f"{k} {v:.1f}" for k, v in pred.parts_s.items() if v))
    print(f"load average after: {os.getloadavg()[0]:.2f}; outputs in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
