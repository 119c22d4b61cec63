"""How well does the fitted link predict a real data-parallel training step?

    .venv/bin/python benchmarks/ddp_prediction.py [--sizes-mib 4 16 48 96] [--steps 10] [--fresh-link]

For each model size: the one-rank step (one thread), then on 2 gloo ranks (one thread each) the
DDP step and the no-overlap step. From the one-rank step and the all-reduce read off the measured
sweep at each DDP bucket's size (`data_parallel.bucket_comm_ms`, log-log interpolation of the
curve; not one alpha-beta line, which misses gloo's bandwidth falling beyond the caches) it
predicts the no-overlap estimate (compute + all-reduce) and the ideal-overlap estimate
(forward + max(backward, all-reduce) + optimizer), and prints, per size and as medians over the
sizes, |predicted - measured| / measured; also the all-reduce alone against the curve and
against the fitted line, and the wait for the slowest rank that the no-overlap step measures
apart (neither estimate includes it).

Targets: the measured DDP step lies between the two estimates, and the no-overlap prediction is
within 25 % of the measured no-overlap step for the largest models (the two largest sizes).
On CPU ranks backward and gloo's threads share the cores, so the first target can fail for a
reason notebook 10 measures (`data_parallel.contention_worker`); on a GPU route it should hold.
Prints PASS or FAIL per target; the exit status is 0 either way (a measurement, not a test).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from labutils.experiments import data_parallel, ddp_step
from labutils.measure.my_link import save_link  # noqa: E402
from labutils.measure.sweep import ensure_link, ensure_sweep, run_sweep, save_sweep  # noqa: E402
from labutils.model import ddp_model
from labutils.model.fit import fit_alpha_beta  # noqa: E402

TARGET_ERROR = 0.25


def measured_link(fresh: bool, low: int, high: int):
    """(the alpha-beta fit, the sweep): the saved gloo/cpu 2-rank ones covering [low, high], or
    (fresh) a new sweep from 1 KiB to the largest gradient, fitted and both saved."""
    if not fresh:
        return ensure_link(2, "gloo", "cpu", quick=False), ensure_sweep(low, high, 2, "gloo", "cpu", quick=False)
    result = run_sweep(nproc=2, backend="gloo", device="cpu", min_bytes="1K", max_bytes=1 << (high - 1).bit_length(),
                       budget_ms=100, progress=False)
    save_sweep(result)
    fit = fit_alpha_beta(result.frame)
    save_link(fit)
    return fit, result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[4, 16, 48, 96])
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="batch per rank")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--fresh-link", action="store_true", help="measure and fit the link again")
    args = parser.parse_args(argv)
    if len(args.sizes_mib) < 4:
        parser.error("give at least 4 model sizes")

    started = time.perf_counter()
    widths = [ddp_model.mlp_for_gradient_bytes(m * 2**20, args.depth) for m in sorted(args.sizes_mib)]
    link, sweep = measured_link(args.fresh_link, *ddp_model.bucket_size_range(widths, args.depth))
    print(f"link: {link.name}, alpha {link.alpha_us:.0f} us, busbw {link.busbw_GBps:.3g} GB/s ({link.source}; "
          f"held-out median error of the fit {link.heldout_median_error:.0%})")
    print(f"all-reduce curve: {len(sweep.frame)} sizes, {int(sweep.frame.size_bytes.min())} to "
          f"{int(sweep.frame.size_bytes.max())} bytes ({sweep.meta.get('date')})")
    configs = [ddp_step.StepConfig(w, args.depth, args.batch, "single", steps=args.steps, warmup=args.warmup)
               for w in widths]
    one = data_parallel.summarize(data_parallel.measure_ddp_steps(configs, 1, "gloo", "cpu", progress=False))
    many = [ddp_step.StepConfig(w, args.depth, args.batch, mode, steps=args.steps, warmup=args.warmup)
            for w in widths for mode in ("ddp", "no_overlap")]
    two = data_parallel.summarize(data_parallel.measure_ddp_steps(many, 2, "gloo", "cpu", progress=False))
    two["run"] += len(one)
    table = data_parallel.prediction_table(pd.concat([one, two], ignore_index=True), link.busbw_GBps, link.alpha_us,
                                sweep=sweep.frame)

    ddp = table[table["mode"] == "ddp"].set_index("gradient_bytes")
    no_ov = table[table["mode"] == "no_overlap"].set_index("gradient_bytes")
    rows = pd.DataFrame({
        "gradient_MiB": ddp.index / 2**20, "compute_ms": ddp["compute_ms"], "comm_pred_ms": no_ov["comm_pred_ms"],
        "comm_line_ms": no_ov["comm_line_ms"],
        "comm_measured_ms": no_ov["comm_measured_ms"], "wait_ms": no_ov["wait_ms"],
        "overlap_pred_ms": ddp["overlap_pred_ms"], "no_overlap_pred_ms": no_ov["no_overlap_pred_ms"],
        "ddp_measured_ms": ddp["measured_ms"], "no_overlap_measured_ms": no_ov["measured_ms"],
        "err_no_overlap": no_ov["error_no_overlap"], "err_overlap_vs_ddp": ddp["error_overlap"],
        "err_no_overlap_vs_ddp": ddp["error_no_overlap"], "ddp_between": ddp["between"]}).reset_index(drop=True)
    with pd.option_context("display.width", 200, "display.precision", 3):
        print(rows.to_string(index=False))

    med_no = rows["err_no_overlap"].median()
    med_ov = rows["err_overlap_vs_ddp"].median()
    med_no_ddp = rows["err_no_overlap_vs_ddp"].median()
    med_comm = ((rows["comm_pred_ms"] - rows["comm_measured_ms"]).abs() / rows["comm_measured_ms"]).median()
    med_line = ((rows["comm_line_ms"] - rows["comm_measured_ms"]).abs() / rows["comm_measured_ms"]).median()
    largest = rows.nlargest(2, "gradient_MiB")
    between = int(rows["ddp_between"].sum())
    print(f"median |pred - meas| / meas over {len(rows)} sizes:")
    print(f"  no-overlap estimate vs no-overlap step: {med_no:.1%}")
    print(f"  no-overlap estimate vs DDP step:     {med_no_ddp:.1%}")
    print(f"  overlap estimate vs DDP step:        {med_ov:.1%}")
    print(f"  all-reduce alone vs measured curve:  {med_comm:.1%}")
    print(f"  all-reduce alone vs one fitted line: {med_line:.1%}")
    print(f"  no-overlap error, two largest models: {', '.join(f'{e:.1%}' for e in largest['err_no_overlap'])}")
    ok_between = between == len(rows)
    ok_largest = bool((largest["err_no_overlap"] <= TARGET_ERROR).all())
    print(f"{'PASS' if ok_between else 'FAIL'}: DDP step between the estimates for {between} of {len(rows)} sizes")
    print(f"{'PASS' if ok_largest else 'FAIL'}: no-overlap prediction within {TARGET_ERROR:.0%} for the largest models")
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
