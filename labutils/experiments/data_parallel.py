"""Data-parallel training, the experiments of notebook 08: launching steps on 1 and N ranks
(labutils.experiments.ddp_step runs inside them), the summaries over steps, and measured against predicted
(labutils.model.ddp_model) as tables. `measure_steps` also serves the CLI and benchmarks/ddp_prediction.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from labutils.core.busbw import format_size
from labutils.core.inputs import LabInputError, check_choice, check_int, check_range
from labutils.experiments.ddp_step import DDP_SECTIONS, StepConfig, contention_worker, ddp_timeline_worker, train_worker
from labutils.measure.launch import resolve_backend
from labutils.measure.pool import rank_progress, shared_pool
from labutils.measure.timeline import Timeline, record_timeline
from labutils.model.ddp_model import (
    DEFAULT_BUCKET_MB,
    bucket_comm_ms,
    distinct_bucket_caps,
    is_between,
    mlp_bucket_sizes,
    predict_step,
)

# --- running it from the notebook, the CLI or a benchmark -----------------------------------------

THREADS_PER_RANK = 1  # every rank, the one-rank baseline included: one "device" = one core here


def measure_ddp_steps(configs: list[StepConfig], nproc: int, backend: str = "auto", device: str = "auto",
            timeout_s: float = 600.0, progress: bool = True, ddp_reference: bool = True,
            interleave: bool = True, budget_s: float | None = None) -> pd.DataFrame:
    """Run `configs` on `nproc` ranks in one launch; one row per timed step (times in ms, rank means).

    `interleave` times the configurations in rounds, one step of each (see `train_worker`); it
    keeps every model in memory at once.
    `budget_s`: seconds of timed rounds for all configurations together; each gets between its
    `steps` and `max_steps` (rows carry `reps` and `budget_cut`). None: each its `steps` (or, with
    `min_time_s` > 0, rounds of about that long).

    On CPU every rank gets `THREADS_PER_RANK` thread(s), the one-rank run too: N ranks then use N
    cores and one rank one core, so the speedup compares one worker with N workers, as one GPU
    with N GPUs, and not one rank that may use every core with N ranks that share them.
    """
    return _launch(configs, nproc, backend, device, timeout_s, progress, ddp_reference, interleave,
                   budget_s=budget_s)[0]


def _launch(configs, nproc, backend, device, timeout_s, progress, ddp_reference=True, interleave=True,
            contention: dict | None = None, ranks: int | None = None,
            budget_s: float | None = None) -> tuple[pd.DataFrame, dict | None]:
    """One run of `configs` on the kernel's `nproc`-rank pool (`pool.shared_pool`; `ranks=1`: on its
    rank 0 alone, with rank 0's cores and threads) and, when `contention` gives its model, the
    contention probe after them: (steps frame, probe result or None)."""

    nproc = check_int("nproc", nproc, low=1)
    if not configs:
        raise LabInputError("configs is empty: give at least one StepConfig")
    if budget_s is not None:
        check_range("budget_s", budget_s, low=0, unit="s")  # 0: only the least repetitions
    choice = resolve_backend(backend, device, nproc)
    pool = shared_pool(nproc, choice.backend, choice.device, THREADS_PER_RANK)
    with rank_progress(max(c.steps for c in configs), f"{ranks or nproc} rank(s), {choice.backend}/{choice.device}",
                       progress, unit="step") as on_report:
        results = pool.run(_run_worker, args=(list(configs),),
                           kwargs={"ddp_reference": ddp_reference, "interleave": interleave, "contention": contention,
                                   "budget_s": budget_s},
                           timeout_s=timeout_s, on_report=on_report, ranks=ranks)
    return pd.DataFrame(results[0]["rows"]), results[0]["contention"]


def _run_worker(ctx, configs, ddp_reference: bool = True, interleave: bool = True,
                contention: dict | None = None, budget_s: float | None = None) -> dict:
    """`train_worker`, then (with `contention`) `contention_worker`, in the same ranks."""
    rows = train_worker(ctx, configs, ddp_reference, interleave, budget_s)
    probe = contention_worker(ctx, **contention) if contention else None
    return {"rows": rows, "contention": probe}


# --- why the bounds hold, or not: backward and the all-reduce, alone and together ----------------


def contention_table(probe: dict) -> pd.DataFrame:
    """The probe as a small table (ms): backward alone, the all-reduce alone, both together, against
    ideal overlap (the longer of the two) and no overlap at all (their sum); `together / sum` near or
    above 1 says the two did not overlap: they shared the same cores."""
    b, c, both = probe["backward_ms"], probe["allreduce_ms"], probe["together_ms"]
    rows = [("backward alone", b), ("all-reduce alone", c), ("both together, measured", both),
            ("ideal overlap: max(backward, all-reduce)", max(b, c)), ("no overlap: backward + all-reduce", b + c)]
    table = pd.DataFrame(rows, columns=["what", "ms"]).set_index("what")
    table["vs no overlap"] = table["ms"] / (b + c)
    return table


def overlap_verdict(probe: dict, margin: float = 0.9) -> str:
    """One sentence from the probe: did backward and the all-reduce overlap?

    `together` at or above `margin` x (backward + all-reduce) means they ran one after the other
    (or got in each other's way); near max(backward, all-reduce) means they overlapped.
    """
    b, c, both = probe["backward_ms"], probe["allreduce_ms"], probe["together_ms"]
    hidden = (b + c - both) / min(b, c) if min(b, c) > 0 else 0.0
    if both >= margin * (b + c):
        return (f"No overlap: together {both:.3g} ms against {b:.3g} + {c:.3g} = {b + c:.3g} ms one after the "
                f"other ({both / (b + c):.0%} of the sum). Backward and the all-reduce shared the same cores, so "
                "the ideal-overlap bound does not apply here.")
    return (f"Overlap: together {both:.3g} ms, below the sum {b + c:.3g} ms; {max(0.0, min(1.0, hidden)):.0%} of the "
            f"shorter part was hidden (ideal: {max(b, c):.3g} ms).")


def _p(q):
    def f(s):
        return float(np.nanpercentile(s, q)) if s.notna().any() else math.nan
    f.__name__ = f"p{q}"
    return f


SUMMARY_KEYS = ["run", "mode", "world_size", "width", "depth", "batch_per_rank", "global_batch",
                "bucket_cap_mb", "gradient_bytes", "backend", "device", "reps", "budget_cut"]
TIME_COLUMNS = ["step_ms", "step_max_ms", *DDP_SECTIONS, "exposed_comm_ms", "other_ms"]


def summarize(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per run: median, p10 and p90 over the timed steps of every time column (ms)."""
    cols = [c for c in TIME_COLUMNS + ["backward_compute_ms", "flat_allreduce_ms"] if c in steps]
    keys = [k for k in SUMMARY_KEYS if k in steps]
    stats = steps.groupby(keys, dropna=False)[cols].agg(["median", _p(10), _p(90)])
    stats.columns = [c if s == "median" else f"{c}_{s}" for c, s in stats.columns]
    out = stats.reset_index()
    out["steps"] = steps.groupby(keys, dropna=False).size().to_numpy()
    out["compute_ms"] = out["forward_ms"] + out["backward_ms"] + out["optimizer_ms"]
    if "backward_compute_ms" in out:  # for DDP: compute is backward without the sync
        ddp = out["backward_compute_ms"].notna()
        out.loc[ddp, "compute_ms"] = (out["forward_ms"] + out["backward_compute_ms"] + out["optimizer_ms"])[ddp]
    return out


# --- the experiments of notebook 10 ----------------------------------------------------------------


@dataclass(frozen=True)
class DataParallelRun:
    """What `scaling_experiment` measured: the `summary` (one row per run, ms), the `contention`
    probe on N ranks (`contention_worker`, None when not asked for), the `widths` measured on N
    ranks and those the budget left out (`dropped_widths`: not even their least steps fitted)."""

    summary: pd.DataFrame
    contention: dict | None = None
    widths: tuple[int, ...] = ()
    dropped_widths: tuple[int, ...] = ()

    @property
    def budget_note(self) -> str:
        """One sentence for the notebook: which models, if any, the budget left out."""
        if not self.dropped_widths:
            return "Every model fitted the budget."
        return (f"Left out for time: the model(s) of width {', '.join(map(str, self.dropped_widths))} (not even "
                "their least steps fitted the budget); give a larger budget_s to measure them.")


def scaling_experiment(widths, depth: int = 4, batch_per_rank: int = 32, nproc: int = 2, steps: int = 10,
                       warmup: int = 2, bucket_caps_mb=(), bucket_width: int | None = None,
                       backend: str = "auto", device: str = "auto", min_time_s: float = 0.0,
                       timeout_s: float = 600.0, progress: bool = True, contention: bool = True,
                       budget_s: float | None = None) -> DataParallelRun:
    """Measure each model (one per width) every way; the summary, one row per run (ms).

    On rank 0 of the N-rank pool alone (`ranks=1`: rank 0's cores and threads): each model at the
    per-rank batch b (weak-scaling baseline) and at the global batch N b (strong-scaling baseline).
    Then on all N ranks of the same pool at b per rank: DDP with the
    default 25 MiB buckets and the no-overlap variant for each model, then DDP at each of
    `bucket_caps_mb` for the model of `bucket_width` (default: the widest; a cap whose buckets equal
    the default's or an earlier cap's is measured once, `ddp_model.distinct_bucket_caps`), then
    (`contention`) the contention probe on the widest model. No configuration is measured twice
    (repeated widths, and with `nproc` 1 the global batch equal to the per-rank one, are measured once).

    `budget_s`: seconds of timed rounds for the whole experiment, shared by the two launches in
    proportion to their configurations (each gets between `steps` and 200 steps; the summary
    carries `reps` and `budget_cut`); None: `steps` each (or rounds of about `min_time_s`).
    """
    if budget_s is not None:
        check_range("budget_s", budget_s, low=0, unit="s")  # 0: only the least repetitions
    widths = list(dict.fromkeys(int(w) for w in np.atleast_1d(widths)))
    singles = []
    for width in widths:
        base = StepConfig(width, depth, batch_per_rank, "single", DEFAULT_BUCKET_MB, steps, warmup, min_time_s)
        singles += [base] + ([replace(base, batch_per_rank=batch_per_rank * nproc)] if nproc > 1 else [])

    def n_rank_configs(kept):  # DDP and no overlap per model; the bucket caps on `bucket_width` (or the widest)
        many = [replace(c, mode=m) for c in singles if c.width in kept and c.batch_per_rank == batch_per_rank
                for m in ("ddp", "no_overlap")]
        width = bucket_width if bucket_width in kept else max(kept)
        base = replace(many[0], width=width, mode="ddp")
        return list(dict.fromkeys(many + [replace(base, bucket_cap_mb=c)
                                          for c in distinct_bucket_caps(width, depth, bucket_caps_mb)]))

    total = len(singles) + len(n_rank_configs(widths))

    def share_s(part):  # the run's share of the budget, by its number of configurations
        return None if budget_s is None else budget_s * len(part) / total

    one_steps = _launch(singles, nproc, backend, device, timeout_s, progress, ranks=1, budget_s=share_s(singles))[0]
    kept = [w for w in widths if w in set(one_steps["width"])]  # the one-rank run leaves out the widest first
    many = n_rank_configs(kept)
    probe = {"width": max(kept), "depth": depth, "batch_per_rank": batch_per_rank} if contention else None
    steps_n, found = _launch(many, nproc, backend, device, timeout_s, progress, contention=probe,
                             budget_s=share_s(many))
    one, n = summarize(one_steps), summarize(steps_n)
    n["run"] += len(one)
    measured = tuple(w for w in widths if w in set(steps_n["width"]))
    return DataParallelRun(pd.concat([one, n], ignore_index=True), found, measured,
                           tuple(w for w in widths if w not in measured))


def _single(summary: pd.DataFrame, run: pd.Series, batch: int) -> pd.Series:
    """The one-rank run of the same model as `run`, at `batch`."""
    rows = summary[(summary["mode"] == "single") & (summary["batch_per_rank"] == batch)
                   & (summary["width"] == run["width"]) & (summary["depth"] == run["depth"])]
    if rows.empty:
        raise LabInputError(f"the summary has no one-rank run of width {run['width']} at batch {batch}")
    return rows.iloc[0]


def scaling_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Speedup and efficiency of each N-rank run with default buckets, weak and strong scaling.

    weak (same b per rank):      speedup = N T1(b) / TN(b) (samples per second), efficiency = T1(b) / TN(b)
    strong (same global batch):  speedup = T1(N b) / TN(b),                        efficiency = speedup / N
    """
    rows = []
    runs = summary[(summary["mode"] != "single") & (summary["bucket_cap_mb"] == DEFAULT_BUCKET_MB)]
    for _, run in runs.iterrows():
        n, b = int(run["world_size"]), int(run["batch_per_rank"])
        for kind, batch in (("weak", b), ("strong", n * b)):
            t1 = float(_single(summary, run, batch)["step_ms"])
            speedup = (n * t1 if kind == "weak" else t1) / run["step_ms"]
            rows.append({"mode": run["mode"], "gradient_bytes": run["gradient_bytes"], "scaling": kind,
                         "world_size": n, "one_rank_batch": batch, "one_rank_ms": t1, "n_rank_ms": run["step_ms"],
                         "speedup": speedup, "efficiency": speedup / n})
    return pd.DataFrame(rows)


def _own_compute(run: pd.Series) -> dict:
    """The N-rank run's own compute medians (ms): DDP's backward without sync, or no-overlap's backward."""
    backward = run["backward_compute_ms"] if run["mode"] == "ddp" else run["backward_ms"]
    return {"gradient_bytes": run["gradient_bytes"], "forward_ms": run["forward_ms"], "backward_ms": backward,
            "optimizer_ms": run["optimizer_ms"]}


def prediction_table(summary: pd.DataFrame, busbw_GBps: float, alpha_us: float,
                     compute: str = "one_rank", sweep: pd.DataFrame | None = None) -> pd.DataFrame:
    """Predicted bounds against the measured step for every N-rank run (ms).

    compute="one_rank": forward, backward and optimizer from the one-rank run of the same model at
    the same per-rank batch (a true prediction). compute="n_rank": from the N-rank run itself
    (backward without sync), which keeps what sharing the machine did to compute and tests only
    the communication model. DDP all-reduces in `mlp_bucket_sizes` buckets, the no-overlap
    variant in one.

    The all-reduce: with `sweep` (a measured all_reduce sweep on the same rank count, covering the
    buckets' sizes) each bucket's time is read off the measured curve (`bucket_comm_ms`);
    `comm_line_ms` is the alpha-beta line's figure beside it, and `extrapolated` flags runs with a
    bucket outside the measured range. Without `sweep` the line is the prediction.

    `between`: overlap bound <= measured <= no-overlap bound; errors are |predicted - measured| /
    measured. `comm_measured_ms` (no-overlap runs) is the all-reduce alone and `wait_ms` the wait
    for the slowest rank, which the bounds leave out.
    """
    check_choice("compute", compute, ("one_rank", "n_rank"))
    runs = summary[summary["mode"] != "single"]
    if sweep is not None and set(sweep["world_size"]) != set(runs["world_size"]):
        raise LabInputError(f"the sweep ran on {sorted(set(sweep['world_size']))} ranks but the steps on "
                            f"{sorted(set(runs['world_size']))}: read the curve of the same rank count")
    rows = []
    for _, run in runs.iterrows():
        width, depth, n = int(run["width"]), int(run["depth"]), int(run["world_size"])
        sizes = [int(run["gradient_bytes"])] if run["mode"] == "no_overlap" else \
            mlp_bucket_sizes(width, depth, run["bucket_cap_mb"])
        source = _single(summary, run, int(run["batch_per_rank"])) if compute == "one_rank" else _own_compute(run)
        line = predict_step(source, n, busbw_GBps, alpha_us, len(sizes))
        pred, extrapolated = line, False
        if sweep is not None:
            comm, reading = bucket_comm_ms(sweep, sizes)
            pred, extrapolated = replace(line, comm_ms=comm), reading.any_extrapolated
        measured = float(run["step_ms"])
        comm_measured = run["allreduce_ms"] if run["mode"] == "no_overlap" else math.nan
        rows.append({"run": run["run"], "mode": run["mode"], "bucket_cap_mb": run["bucket_cap_mb"],
                     "gradient_bytes": run["gradient_bytes"], "buckets": len(sizes), "compute_ms": pred.compute_ms,
                     "backward_ms": pred.backward_ms, "comm_pred_ms": pred.comm_ms, "comm_line_ms": line.comm_ms,
                     "extrapolated": extrapolated, "comm_measured_ms": comm_measured, "wait_ms": run["wait_ms"],
                     "no_overlap_pred_ms": pred.no_overlap_ms,
                     "overlap_pred_ms": pred.overlap_ms, "measured_ms": measured,
                     "error_no_overlap": abs(pred.no_overlap_ms - measured) / measured,
                     "error_overlap": abs(pred.overlap_ms - measured) / measured,
                     "between": is_between(measured, pred)})
    return pd.DataFrame(rows)


def time_breakdown(summary: pd.DataFrame) -> pd.DataFrame:
    """Where the median step went, per run (ms); the columns add up to `step_ms` exactly.

    DDP's backward holds its exposed communication (waiting for the slowest rank included): it
    is split into compute and exposed comm. The no-overlap variant times the wait on its own.
    """
    out = pd.DataFrame(index=summary.index)
    out["label"] = [f"{format_size(r['gradient_bytes'])} grad, {r['mode']}, {r['world_size']} rank(s), "
                    f"b={r['batch_per_rank']}" + (f", {r['bucket_cap_mb']:g} MiB buckets" if r["mode"] == "ddp" else "")
                    for _, r in summary.iterrows()]
    ddp = (summary["mode"] == "ddp").to_numpy()
    exposed = summary["exposed_comm_ms"].fillna(0.0)
    out["forward"] = summary["forward_ms"]
    out["backward"] = np.where(ddp, summary["backward_ms"] - exposed, summary["backward_ms"])
    out["wait for slowest rank"] = np.where(ddp, 0.0, summary["wait_ms"])
    out["exposed comm"] = np.where(ddp, exposed, summary["allreduce_ms"])
    out["optimizer"] = summary["optimizer_ms"]
    out["other"] = summary["step_ms"] - out[["forward", "backward", "wait for slowest rank", "exposed comm",
                                             "optimizer"]].sum(axis=1)
    out["step_ms"] = summary["step_ms"]
    return out.set_index("label")


def record_ddp_step(width: int = 256, depth: int = 4, batch_per_rank: int = 32, bucket_cap_mb: float = 1.0,
                    nproc: int = 2, backend: str = "gloo", device: str = "cpu", warmup: int = 2,
                    timeout_s: float = 120.0) -> Timeline:
    """Record one DDP training step on `nproc` ranks (see ddp_step.ddp_timeline_worker), with
    `THREADS_PER_RANK` threads as the measured steps: the same pool as `scaling_experiment`'s."""
    check_int("width", width, low=1, high=65536)
    check_int("depth", depth, low=1, high=64)
    check_int("batch_per_rank", batch_per_rank, low=1)
    check_range("bucket_cap_mb", bucket_cap_mb, low=0, low_open=True, unit="MiB")
    kwargs = {"width": width, "depth": depth, "batch_per_rank": batch_per_rank, "bucket_cap_mb": bucket_cap_mb,
              "warmup": warmup}
    return record_timeline(ddp_timeline_worker, nproc, kwargs, backend, device, timeout_s,
                   f"one DDP step, width {width}, depth {depth}, {batch_per_rank} rows per rank, "
                   f"{bucket_cap_mb:g} MiB buckets, {nproc} ranks ({backend} on {device})",
                   threads_per_rank=THREADS_PER_RANK)  # the measured steps' threads, and their pool
