"""Data-parallel training, the experiments of notebook 10: launching steps on 1 and N ranks
(labutils.experiments.ddp_step runs inside them), the summaries over steps, and measured against predicted
(labutils.model.ddp_model) as tables. `measure_steps` also serves the CLI and benchmarks/ddp_prediction.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from labutils.core.busbw import binary_size
from labutils.core.inputs import LabInputError, check_choice, check_int, check_range
from labutils.experiments.ddp_step import DDP_SECTIONS, StepConfig, contention_worker, ddp_timeline_worker, train_worker
from labutils.measure.launch import resolve_backend
from labutils.measure.pool import rank_progress, shared_pool
from labutils.measure.timeline import Timeline, record_timeline
from labutils.model.ddp_model import (
    DEFAULT_BUCKET_MB,
    between_estimates_figure,
    bucket_comm_ms,
    distinct_bucket_caps,
    estimate_compute,
    is_between,
    mlp_bucket_count,
    mlp_bucket_sizes,
    mlp_for_gradient_bytes,
    mlp_gradient_bytes,
    mlp_param_count,
    position,
    predict_step,
)
from labutils.model.fit import ARTICLE_BUSBW_GBps, allreduce_ms

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


# --- the sizes of the run and the all-reduce each gradient implies ---------------------------------


@dataclass(frozen=True)
class Sizes:
    """What notebook 10 measures: per-rank batch, model widths, bucket caps (MiB), least timed and
    warm-up steps; the notebook's parameters where given, else `sizing.ddp_plan`'s."""

    batch_per_rank: int
    widths: tuple[int, ...]
    bucket_caps_mb: tuple[float, ...]
    steps: int
    warmup: int

    def note(self, plan) -> str:
        return (f"{plan.why}\nper-rank batch {self.batch_per_rank}, models of width {list(self.widths)}, "
                f"bucket caps {list(self.bucket_caps_mb)} MiB")


def choose_sizes(plan, depth: int, batch_per_rank=None, gradient_mib=None, bucket_caps_mb=None, steps=None,
                 warmup=None) -> Sizes:
    """The notebook's parameters, each None replaced by `plan`'s (a `sizing.DdpPlan`); `gradient_mib`
    gives the models by gradient size (MiB), each turned into the width closest to it."""
    widths = [mlp_for_gradient_bytes(m * 2**20, depth) for m in gradient_mib] if gradient_mib else plan.widths
    return Sizes(check_int("batch_per_rank", batch_per_rank or plan.batch_per_rank, low=1), tuple(widths),
                 tuple(float(c) for c in (bucket_caps_mb or plan.bucket_caps_mb)),
                 check_int("steps", steps or plan.steps, low=1), check_int("warmup", warmup or plan.warmup, low=0))


def gradient_table(widths, depth: int, nproc: int, link, sweep: pd.DataFrame) -> pd.DataFrame:
    """Each model's parameters, gradient and DDP buckets at the default cap, and its all-reduce (ms)
    three ways: read off the measured `sweep` bucket by bucket, from `link`'s one alpha-beta line,
    and on the source article's 22 GB/s across two sockets (no latency)."""
    rows = []
    for w in widths:
        grad, buckets = mlp_gradient_bytes(w, depth), mlp_bucket_count(w, depth, DEFAULT_BUCKET_MB)
        rows.append({"width": w, "parameters": mlp_param_count(w, depth), "gradient": binary_size(grad),
                     f"buckets ({DEFAULT_BUCKET_MB:g} MiB)": buckets,
                     "all-reduce, measured curve (ms)": bucket_comm_ms(
                         sweep, mlp_bucket_sizes(w, depth, DEFAULT_BUCKET_MB))[0],
                     "all-reduce, one α-β line (ms)": allreduce_ms(grad, nproc, link.busbw_GBps, link.alpha_us,
                                                                  buckets),
                     f"on the article's {ARTICLE_BUSBW_GBps:g} GB/s, SYS (ms)": allreduce_ms(grad, nproc,
                                                                                    ARTICLE_BUSBW_GBps)})
    return pd.DataFrame(rows)


def sweep_note(sweep, low: int, high: int) -> str:
    """Which sizes the all-reduce curve covers, against the sizes the buckets need (bytes)."""
    sizes = sweep.frame["size_bytes"]
    return (f"the measured curve: {binary_size(int(sizes.min()))} to {binary_size(int(sizes.max()))} "
            f"({sweep.meta.get('date')}); the buckets need {binary_size(low)} to {binary_size(high)}")


# --- how far backward and the all-reduce got in each other's way ----------------------------------


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

    `together` at or above `margin` x (backward + all-reduce) means they ran (nearly) one after the
    other: "No overlap" when nothing of the sum was saved at the percent printed (above the sum,
    each slowed the other), else "Little overlap" with the share saved; below it, the share of the
    shorter part that was hidden, (backward + all-reduce - together) / min(backward, all-reduce).
    """
    b, c, both = probe["backward_ms"], probe["allreduce_ms"], probe["together_ms"]
    hidden = (b + c - both) / min(b, c) if min(b, c) > 0 else 0.0
    if both >= margin * (b + c):
        worse = (" Together took longer than one after the other: each slowed the other down." if both > b + c
                 else "")
        saved = round(100 * (1 - both / (b + c)))  # the share of the sum the overlap saved, as printed
        head = f"Little overlap ({saved}% of the sum saved)" if saved > 0 else "No overlap"
        return (f"{head}: together {both:.3g} ms against {b:.3g} + {c:.3g} = {b + c:.3g} ms one after the "
                f"other ({both / (b + c):.0%} of the sum).{worse} The ideal-overlap estimate, which assumes the two "
                "run side by side without slowing each other, is optimistic here.")
    return (f"Overlap: together {both:.3g} ms, below the sum {b + c:.3g} ms; {max(0.0, min(1.0, hidden)):.0%} of the "
            f"shorter part was hidden (ideal overlap: {max(b, c):.3g} ms).")


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

    @property
    def steps_note(self) -> str:
        """One sentence: how many runs, how many timed steps each, and how many the budget cut."""
        s, cut = self.summary, int(self.summary["budget_cut"].sum())
        return (f"{len(s)} runs, {int(s['steps'].min())} to {int(s['steps'].max())} timed steps each"
                + (f"; the time budget, not `steps`, set the number of timed steps in "
                   f"{'all' if cut == len(s) else cut} of them (budget_cut)" if cut else ""))


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
    """The two estimates against the measured step for every N-rank run (ms).

    compute="one_rank": forward, backward and optimizer from the one-rank run of the same model at
    the same per-rank batch (a true prediction). compute="n_rank": from the N-rank run itself
    (backward without sync), which keeps what sharing the machine did to compute and tests only
    the communication model. DDP all-reduces in `mlp_bucket_sizes` buckets, the no-overlap
    variant in one.

    The all-reduce: with `sweep` (a measured all_reduce sweep on the same rank count, covering the
    buckets' sizes) each bucket's time is read off the measured curve (`bucket_comm_ms`);
    `comm_line_ms` is the alpha-beta line's figure beside it, and `extrapolated` flags runs with a
    bucket outside the measured range. Without `sweep` the line is the prediction.

    `position`: the measured step "below" the ideal-overlap estimate, "between" the two, or "above"
    the no-overlap one (`ddp_model.position`; `between` is its bool); errors are
    |predicted - measured| / measured. `comm_measured_ms` (no-overlap runs) is the all-reduce alone
    and `wait_ms` the wait for the slowest rank, which neither estimate includes.
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
                     "position": position(measured, pred.overlap_ms, pred.no_overlap_ms),
                     "between": is_between(measured, pred)})
    return pd.DataFrame(rows)


def _compared(a: float, b: float, faster: str, slower: str, same: str) -> str:
    """`faster` when time a < time b, `slower` when a > b, `same` when they are equal (to 3 digits)."""
    if f"{a:.3g}" == f"{b:.3g}":
        return same
    return faster if a < b else slower


def scaling_sentence(scaling: pd.DataFrame) -> str:
    """What the run's largest model showed (`scaling_table` rows): DDP's weak and strong speedup, each
    said faster / slower / as fast as one rank from the numbers, and DDP against the no-overlap variant."""
    big = scaling[scaling["gradient_bytes"] == scaling["gradient_bytes"].max()].set_index(["mode", "scaling"])
    weak, strong = big.loc[("ddp", "weak")], big.loc[("ddp", "strong")]
    n, size = int(weak["world_size"]), binary_size(int(weak["gradient_bytes"]))
    rate = _compared(1.0 / weak["speedup"], 1.0, "more", "fewer", "as many")
    parts = [f"Largest model ({size} gradient), DDP on {n} ranks: {weak['speedup']:.3g}x the samples per second of "
             f"one rank ({rate} than one rank alone; weak-scaling efficiency {weak['efficiency']:.2f}, where "
             f"{n}x would be 1.00)" if rate != "as many" else
             f"Largest model ({size} gradient), DDP on {n} ranks: as many samples per second as one rank "
             f"(weak-scaling efficiency {weak['efficiency']:.2f})",
             f"with the global batch fixed, its step took {strong['n_rank_ms']:.3g} ms against one rank's "
             f"{strong['one_rank_ms']:.3g} ms: " + _compared(strong["n_rank_ms"], strong["one_rank_ms"],
                                                           f"faster, a strong-scaling speedup of "
                                                           f"{strong['speedup']:.3g}x",
                                                           f"slower than one rank ({strong['speedup']:.3g}x)",
                                                           "as fast as one rank")]
    if ("no_overlap", "weak") in big.index:
        ddp_ms, flat_ms = float(weak["n_rank_ms"]), float(big.loc[("no_overlap", "weak"), "n_rank_ms"])
        parts.append(f"DDP's step ({ddp_ms:.3g} ms) was " + _compared(
            ddp_ms, flat_ms, f"{flat_ms / ddp_ms:.3g}x faster than", f"{ddp_ms / flat_ms:.3g}x slower than",
            "as fast as") + f" the no-overlap variant's ({flat_ms:.3g} ms)")
    return "; ".join(parts) + "."


@dataclass(frozen=True)
class Prediction:
    """Notebook 10's estimates against the measured steps: `table` with compute from `compute`
    ("one_rank", or "n_rank" where ranks share a GPU: `ddp_model.estimate_compute`), `own` with the
    N-rank run's own compute, and the medians of |predicted - measured| / measured over the
    no-overlap runs with default buckets (the step, and the all-reduce alone: read off the curve and
    from one line)."""

    table: pd.DataFrame
    own: pd.DataFrame
    compute: str

    @property
    def default(self) -> pd.DataFrame:
        """The runs with DDP's default buckets, one DDP and one no-overlap row per model."""
        return self.table[self.table["bucket_cap_mb"] == DEFAULT_BUCKET_MB]

    def _no_overlap(self, table=None):
        t = self.default if table is None else table.loc[self.default.index]
        return t[t["mode"] == "no_overlap"]

    @property
    def step_error(self) -> float:
        return float(self._no_overlap()["error_no_overlap"].median())

    @property
    def own_compute_error(self) -> float:
        return float(self._no_overlap(self.own)["error_no_overlap"].median())

    def allreduce_error(self, column: str = "comm_pred_ms") -> float:
        """`comm_pred_ms`: read off the measured curve; `comm_line_ms`: one alpha-beta line."""
        rows = self._no_overlap()
        return float(((rows[column] - rows["comm_measured_ms"]).abs() / rows["comm_measured_ms"]).median())

    @property
    def between(self) -> str:
        """"k/n": DDP runs with default buckets whose step lay between the two estimates."""
        return between_estimates_figure(self.table)

    def report(self) -> str:
        """The errors, where the measured steps lay against the estimates, and extrapolations."""
        lines = [f"no-overlap estimate's error (median): {self.step_error:.0%} with "
                 f"{self.compute.replace('_', '-')} compute, {self.own_compute_error:.0%} with the run's own compute",
                 allreduce_sources_sentence(self.allreduce_error(), self.allreduce_error("comm_line_ms")),
                 placement_sentence(self.default)]
        if self.table["extrapolated"].any():
            lines.append(f"{int(self.table['extrapolated'].sum())} run(s) have a bucket outside the measured sizes: "
                         "their all-reduce is extrapolated from the curve's end, not measured")
        return "\n".join(lines)


def allreduce_sources_sentence(curve_error: float, line_error: float) -> str:
    """The no-overlap runs' all-reduce against its two estimates (median relative errors): read off
    the measured curve and from one alpha-beta line, and which came closer at the percent printed."""
    curve, line = round(100 * curve_error), round(100 * line_error)
    closer = ("the two did as well" if curve == line else
              "the curve came closer" if curve < line else "the one line came closer here")
    return (f"the all-reduce alone: {curve}% off read from the measured curve, {line}% from one line "
            f"(median): {closer}")


def predict_runs(summary: pd.DataFrame, link, sweep: pd.DataFrame, route) -> Prediction:
    """`prediction_table` twice (compute from `ddp_model.estimate_compute(route)`, and the N-rank run's own)."""
    compute = estimate_compute(route)
    return Prediction(prediction_table(summary, link.busbw_GBps, link.alpha_us, compute=compute, sweep=sweep),
                      prediction_table(summary, link.busbw_GBps, link.alpha_us, compute="n_rank", sweep=sweep),
                      compute)


_WHERE = {"below": "below the ideal-overlap estimate", "between": "between the two estimates",
          "above": "above the no-overlap estimate"}
_WHY = {"above": "above the no-overlap estimate, the step cost more than compute plus the all-reduce read off the "
                 "curve: contention for cores, SMs or memory bandwidth, and waits for the slower rank, which "
                 "neither estimate includes",
        "below": "below the ideal-overlap estimate, compute or the all-reduce ran faster in the step than the "
                 "estimate took them to be"}


def placement_sentence(table: pd.DataFrame) -> str:
    """Where each mode's measured steps lay against its two estimates (`prediction_table` rows with a
    `position`), counted from the numbers, and what lying outside them means."""
    parts, seen = [], set()
    for mode, name in (("ddp", "DDP"), ("no_overlap", "no-overlap variant")):
        rows = table[table["mode"] == mode]
        if rows.empty:
            continue
        counts = rows["position"].value_counts()
        seen |= set(counts.index)
        said = ", ".join(f"{_WHERE[p]} at {int(counts[p])}" for p in ("below", "between", "above") if p in counts)
        parts.append(f"{name}: {said} of {len(rows)} model size(s)")
    why = [_WHY[p] for p in ("above", "below") if p in seen]
    return "Measured steps: " + "; ".join(parts) + "." + "".join(f" {w[0].upper()}{w[1:]}." for w in why)


def bucket_runs(table: pd.DataFrame, width: int, depth: int) -> pd.DataFrame:
    """The DDP runs of the model of `width` (`prediction_table` rows), one per bucket cap measured."""
    rows = table[(table["mode"] == "ddp") & (table["gradient_bytes"] == mlp_gradient_bytes(width, depth))]
    return rows.sort_values("bucket_cap_mb")


def bucket_sentence(summary: pd.DataFrame, width: int, depth: int, caps_asked=()) -> str:
    """Which bucket cap gave the fastest DDP step for the model of `width`, from the summary's medians,
    and whether the gap to the slowest exceeds the step-to-step spread (the p10-p90 ranges overlap or
    not); says so when only one layout was measured (caps whose buckets equal another's ran once)."""
    rows = summary[(summary["mode"] == "ddp") & (summary["width"] == width) & (summary["depth"] == depth)]
    repeats = [c for c in caps_asked if float(c) not in set(rows["bucket_cap_mb"])]
    note = (f"Caps {list(repeats)} MiB give this model the same buckets as a cap measured, so each layout ran once. "
            if repeats else "")
    if len(rows) < 2:
        return note + "Only one bucket layout was measured for this model: no comparison to draw."
    rows = rows.sort_values("step_ms")
    best, worst = rows.iloc[0], rows.iloc[-1]
    if f"{best['step_ms']:.3g}" == f"{worst['step_ms']:.3g}":
        return note + f"Every cap measured gave the same median step ({best['step_ms']:.3g} ms): a tie."
    apart = best["step_ms_p90"] < worst["step_ms_p10"]
    return note + (f"Fastest: {best['bucket_cap_mb']:g} MiB buckets ({best['step_ms']:.3g} ms median); slowest: "
                   f"{worst['bucket_cap_mb']:g} MiB ({worst['step_ms']:.3g} ms). "
                   + ("Their p10-p90 ranges do not overlap: the gap is larger than the step-to-step spread."
                      if apart else "Their p10-p90 ranges overlap: the gap is within the step-to-step spread, "
                                    "so this run does not single out a best cap."))


def largest_single(summary: pd.DataFrame, batch_per_rank: int) -> pd.Series:
    """The summary row of the largest model's one-rank step at `batch_per_rank` (medians, ms)."""
    rows = summary[(summary["mode"] == "single") & (summary["batch_per_rank"] == batch_per_rank)]
    return rows[rows["width"] == rows["width"].max()].iloc[0]


def dashboard_inputs(base: pd.Series, depth: int, link) -> dict:
    """`ddp_scaling_dashboard`'s starting point: a one-rank step (`largest_single`: gradient, compute,
    backward's share of it) and `link`'s busbw and alpha."""
    return {"gradient_bytes": float(base["gradient_bytes"]), "busbw_GBps": link.busbw_GBps,
            "compute_ms": float(base["compute_ms"]), "alpha_us": link.alpha_us,
            "buckets": mlp_bucket_count(int(base["width"]), depth, DEFAULT_BUCKET_MB),
            "hideable": round(float(base["backward_ms"] / base["compute_ms"]), 2)}


def time_breakdown(summary: pd.DataFrame) -> pd.DataFrame:
    """Where the median step went, per run (ms); the columns add up to `step_ms` exactly.

    DDP's backward holds its exposed communication (waiting for the slowest rank included): it
    is split into compute and exposed comm. The no-overlap variant times the wait on its own.
    """
    out = pd.DataFrame(index=summary.index)
    out["label"] = [f"{binary_size(r['gradient_bytes'])} grad, {r['mode']}, {r['world_size']} rank(s), "
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
