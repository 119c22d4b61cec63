"""Slider latency of the time-budget dashboard: from a slider change to the updated readout and figure.

    .venv/bin/python benchmarks/slider_latency.py [--changes 200] [--target-ms 30]

Moves the bandwidth and η sliders alternately through 200 values (a sweep there and back, as a
hand dragging them would), timing each change until the readout HTML and the figure's PNG bytes
are both new. The change handler runs synchronously, so the time measured is everything the
kernel does before it can send the new readout and image to the browser. Prints the median and
90th percentile of the wall time and PASS/FAIL against the target (median), and the median CPU
time as a steadier figure. Timings on a busy machine are noisy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def moves(n: int) -> list[tuple[str, float]]:
    """n slider changes: bandwidth 2..100 GB/s and η 0.6..0.95, each swept there and back."""
    half = max(n // 2, 1)
    bandwidth = np.geomspace(2.0, 100.0, half // 2 + 1)
    eta = np.linspace(0.6, 0.95, half // 2 + 1)
    sweep_b = np.concatenate([bandwidth, bandwidth[-2::-1]])[:half]
    sweep_e = np.concatenate([eta, eta[-2::-1]])[:n - half]
    out = []
    for i in range(max(len(sweep_b), len(sweep_e))):
        if i < len(sweep_b):
            out.append(("bandwidth_GBps", float(sweep_b[i])))
        if i < len(sweep_e):
            out.append(("eta", float(sweep_e[i])))
    return out[:n]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--target-ms", type=float, default=30.0)
    args = parser.parse_args()

    from labutils.show.budget_plots import budget_dashboard

    dash = budget_dashboard()
    times_ms, cpu_ms = [], []
    for key, value in moves(args.changes):
        before_html, before_png = dash.readout.value, dash.png()
        start, start_cpu = time.perf_counter(), time.process_time()
        dash.sliders[key].value = value
        html, png = dash.readout.value, dash.png()
        times_ms.append((time.perf_counter() - start) * 1e3)
        cpu_ms.append((time.process_time() - start_cpu) * 1e3)
        if dash.state()["error"] or html == before_html or png == before_png:
            print(f"FAIL: moving {key} to {value:g} did not update readout and figure "
                  f"({dash.state()['error']})")
            return 1
    median = statistics.median(times_ms)
    p90 = float(np.percentile(times_ms, 90))
    verdict = "PASS" if median < args.target_ms else "FAIL"
    print(f"slider -> readout + figure over {len(times_ms)} changes: median {median:.1f} ms, "
          f"p90 {p90:.1f} ms, max {max(times_ms):.1f} ms (target: median < {args.target_ms:g} ms) {verdict}")
    print(f"CPU time of this process per change: median {statistics.median(cpu_ms):.1f} ms "
          f"(wall time above includes waiting for the CPU on a busy machine)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
