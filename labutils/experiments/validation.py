"""The two-device budget held against a measured split layer (notebook 09): the model side.

The rows it reads come from labutils.experiments.split_timing (one per size, mode and rank); nothing here
starts a process. Reading order:
1. the rows collapsed over ranks (`per_size`), and the one-rank row paired with a two-rank row;
2. the budget's inputs for one size: S and C from the one-rank run (T1 = S + C), Q = 1 all-reduce
   of V = the output's bytes, latency and bandwidth from the link fitted in notebook 05
   (labutils.measure.my_link: `LinkFit.budget_params`), never from the timings predicted; and eta, from
   one of two places, which makes two views of the same T2:
   - **a priori** (`apriori_table`): eta stated before the split runs, 1 (perfect halves) or
     C / (2 C_half) measured in a separate run of the split's halves with no communication
     ("halves"). The split run is not read, so its T2 and the break-even size are predicted;
   - **after the fact** (`validation_table`): eta = C / (2 C_rank) with C_rank the split run's own
     compute. Whenever that eta is <= 1 the predicted compute C / (2 eta) *is* the measured split
     compute, and only S and l + V/B are predicted: a decomposition of T2, not a forecast;
3. predicted against measured: both views per size (`compare_views`) and in one table of errors
   and break-evens (`views_summary`); the break-even size; overlap of chunked all-reduces with
   compute; two replicas against one split layer; the hand-in summary;
4. what the run showed, in sentences built from its numbers, never written in advance: which view
   of T2 was closer and which term (S, C/(2 eta), l + V/B) drove each error (`error_terms`,
   `errors_sentence`), whether the split paid (`pays_sentence`), what overlap bought
   (`overlap_sentence`), replicas against shards (`replicas_sentence`).

Why the break-even has a floor: splitting pays when C (1 - 1/(2 eta)) > Q (l + V/B), and with
eta <= 1 the bracket is at most 1/2, so a layer whose whole compute C is below 2 Q (l + V/B)
never gains from the split, whatever eta. The measured break-even is where T2 crosses T1 (both
from the split run); an a-priori one is where its predicted T2 crosses the one-rank T1 of the run
it was predicted from (`views_summary`).

Overlap (`overlap_table`): in a tensor-parallel layer the all-reduce is on the critical path (the
LayerNorm after it needs its result), so the layer's own compute cannot hide it; cutting the
batch into k chunks lets chunk i's all-reduce run while chunk i+1 computes. Each chunk pays l
again, the first chunk's compute has nothing to hide and the last chunk's all-reduce nothing to
hide behind. Both figures it is held against are estimates under the budget's assumptions (no
contention: on a CPU gloo's asynchronous all-reduce runs on a worker thread that needs a core, on
a GPU an NCCL kernel takes SMs and memory bandwidth from the compute it overlaps), not bounds of a
real step: "no overlap" S + C/(2 eta) + k (l + V/(k B)) and "perfect overlap" S + max(C/(2 eta), H).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from labutils.core.inputs import LabInputError
from labutils.experiments.tensor_parallel import LayerSize
from labutils.model import budget

# --- 1. rows collapsed over ranks -----------------------------------------------------------------------

def per_size(frame: pd.DataFrame, mode: str | None = None) -> pd.DataFrame:
    """Collapse ranks (rows of `mode` only, when given): the slowest rank's median parts (max over
    ranks) and the step time, per (size, mode, chunks)."""
    if mode is not None:
        frame = frame[frame["mode"] == mode]
        if frame.empty:
            raise LabInputError(f"the measurements hold no rows of mode {mode!r}")
    keys = ["batch", "hidden", "ffn", "dtype", "mode", "chunks", "ranks"]
    agg = {c: "max" for c in ("serial_ms", "compute_ms", "communication_ms", "total_ms", "gap_ms")}
    agg.update(step_ms="first", step_p90_ms="first", reps="first", compute_slowest_ms="first")
    return frame.groupby(keys, as_index=False).agg(agg)


def _pairs(frame: pd.DataFrame, mode: str):
    """(one-rank row, two-rank row of `mode`, LayerSize) for every size measured in both modes."""
    one, two = per_size(frame, "whole"), per_size(frame, mode)
    if (two["ranks"] != 2).any():
        raise LabInputError(f"the budget compares one device with two; these {mode} rows ran on "
                            f"{sorted(two['ranks'].unique())} ranks")
    for _, r2 in two.iterrows():
        match = one[(one.batch == r2.batch) & (one.hidden == r2.hidden) & (one.ffn == r2.ffn)]
        if match.empty:
            raise LabInputError(f"no one-rank measurement for size {r2.batch}x{r2.hidden}")
        yield match.iloc[0], r2, LayerSize(int(r2.batch), int(r2.hidden), int(r2.ffn))


# --- 2. the budget's inputs: a priori and after the fact ------------------------------------------------

@dataclass(frozen=True)
class BudgetInputs:
    """The budget's parameters for one layer size, from measurements and the measured link.

    S_ms, C_ms: serial and compute of the one-rank run (T1 = S + C); eta capped at 1 as the
    budget requires (`eta_measured` keeps the uncapped value: above 1 when a half runs better than
    half the whole, e.g. because its weights fit in cache; see `eta_from` for where it comes from);
    Q all-reduces of `volume_bytes` each (the output, batch x hidden x element bytes); latency_ms
    and bandwidth_GBps from the link fit.
    """

    S_ms: float
    C_ms: float
    eta: float
    Q: int
    volume_bytes: float
    latency_ms: float
    bandwidth_GBps: float
    eta_measured: float = math.nan

    def as_args(self) -> tuple:
        """Positional arguments of labutils.model.budget.t_two_ms / evaluate / ideal_overlap_ms."""
        return (self.S_ms, self.C_ms, self.eta, self.Q, self.latency_ms, self.volume_bytes, self.bandwidth_GBps)


def eta_from(t1, run) -> float:
    """eta = C / (2 C_rank), uncapped: C the one-rank row `t1`'s compute, C_rank the compute of the
    slower rank of `run` (its `compute_slowest_ms`, median over steps; else `compute_ms`). inf when
    C_rank <= 0. `run` is the split itself (after the fact) or the halves run (a priori)."""
    c_rank = float(run["compute_slowest_ms"] if "compute_slowest_ms" in run else run["compute_ms"])
    return math.inf if c_rank <= 0 else float(t1["compute_ms"]) / (2 * c_rank)


def inputs_with_eta(t1, eta: float, link, volume_bytes: float, Q: int = 1) -> BudgetInputs:
    """Budget inputs from a one-rank row `t1` (S = serial, C = compute, ms) and a given `eta`
    (capped at 1 for the budget, kept as `eta_measured`); latency and bandwidth from `link` (a
    fit.LinkFit, translated by its `budget_params`). For 2 ranks the ring factor 2(N-1)/N is 1, so
    V / busbw is exactly the all-reduce's bandwidth term. Reads nothing of a two-rank run."""
    params = link.budget_params()
    return BudgetInputs(float(t1["serial_ms"]), float(t1["compute_ms"]), min(float(eta), 1.0), int(Q),
                        float(volume_bytes), float(params["latency_ms"]), float(params["bandwidth_GBps"]), float(eta))


def estimate_inputs(t1, t2, link, volume_bytes: float, Q: int = 1) -> BudgetInputs:
    """After the fact: budget inputs from a one-rank row `t1` and the two-rank split row `t2` it is
    held against (per_size rows or dicts), eta = eta_from(t1, t2) capped at 1."""
    return inputs_with_eta(t1, eta_from(t1, t2), link, volume_bytes, Q)


def apriori_table(prior: pd.DataFrame, link, Q: int = 1) -> pd.DataFrame:
    """A priori: per size, T2 and the speedup predicted before the split runs.

    From `prior`, the rows of a run of "whole" (one rank: S, C and T1) and "halves" (the split's
    halves on two ranks, no communication: C_half, the slower half's compute); rows of any other
    mode, a split run in the same frame included, are not read. Two etas stated up front: 1 and
    eta_halves = C / (2 C_half) (capped at 1 for the budget); T2 = S + C/(2 eta) + Q(l + V/B) with
    l and B from `link`.
    Columns: batch, hidden, work_flops, volume_bytes, S_ms, C_ms, T1_ms (the one-rank step of
    `prior`), C_half_ms, eta_halves (uncapped), comm_pred_ms, T2_eta1_ms, T2_apriori_ms (at
    eta_halves), speedup_eta1, speedup_apriori (T1 / T2).
    """
    rows = []
    for r1, rh, size in _pairs(prior, "halves"):
        v = size.output_bytes(rh["dtype"])
        halves = inputs_with_eta(r1, eta_from(r1, rh), link, v, Q)
        perfect = dataclasses.replace(halves, eta=1.0, eta_measured=1.0)
        t1_ms = float(r1.step_ms)
        t2_eta1, t2_halves = float(budget.t_two_ms(*perfect.as_args())), float(budget.t_two_ms(*halves.as_args()))
        rows.append({"batch": size.batch, "hidden": size.hidden, "work_flops": size.flops, "volume_bytes": v,
                     "S_ms": halves.S_ms, "C_ms": halves.C_ms, "T1_ms": t1_ms,
                     "C_half_ms": float(rh["compute_slowest_ms"]), "eta_halves": halves.eta_measured,
                     "comm_pred_ms": float(budget.comm_ms(Q, halves.latency_ms, v, halves.bandwidth_GBps)),
                     "T2_eta1_ms": t2_eta1, "T2_apriori_ms": t2_halves,
                     "speedup_eta1": t1_ms / t2_eta1, "speedup_apriori": t1_ms / t2_halves})
    return pd.DataFrame(rows).sort_values("work_flops").reset_index(drop=True)


# --- 3. predicted against measured ----------------------------------------------------------------

def validation_table(frame: pd.DataFrame, link) -> pd.DataFrame:
    """After the fact, per size: estimate the inputs from the "whole" and "split" rows (eta from
    the split's own compute), predict T2 with labutils.model.budget, and compare with the measured T2.

    Columns: batch, hidden, work_flops, volume_bytes, S_ms, C_ms, C_rank_ms (the split's compute,
    slowest rank), S2_ms (the split's serial part, slowest rank), eta (capped),
    eta_measured, T1_ms, T2_ms (measured), comm_ms (measured, slowest rank), comm_pred_ms,
    T2_pred_ms, rel_error = (predicted - measured) / measured, speedup, speedup_pred (T1 / T2).
    """

    rows = []
    for r1, r2, size in _pairs(frame, "split"):
        v = size.output_bytes(r2["dtype"])
        inp = estimate_inputs(r1, r2, link, v)
        t1_ms, t2_ms = float(r1.step_ms), float(r2.step_ms)
        pred = float(budget.t_two_ms(*inp.as_args()))
        rows.append({"batch": size.batch, "hidden": size.hidden, "work_flops": size.flops, "volume_bytes": v,
                     "S_ms": inp.S_ms, "C_ms": inp.C_ms, "C_rank_ms": inp.C_ms / (2 * inp.eta_measured),
                     "S2_ms": float(r2.serial_ms), "eta": inp.eta,
                     "eta_measured": inp.eta_measured, "T1_ms": t1_ms, "T2_ms": t2_ms,
                     "comm_ms": float(r2.communication_ms),
                     "comm_pred_ms": float(budget.comm_ms(inp.Q, inp.latency_ms, v, inp.bandwidth_GBps)),
                     "T2_pred_ms": pred, "rel_error": (pred - t2_ms) / t2_ms,
                     "speedup": t1_ms / t2_ms, "speedup_pred": t1_ms / pred})
    return pd.DataFrame(rows).sort_values("work_flops").reset_index(drop=True)


def budget_inputs_for(frame: pd.DataFrame, link, batch: int, hidden: int) -> BudgetInputs:
    """The after-the-fact inputs of one measured size (for the exercise and for reading one row)."""
    for r1, r2, size in _pairs(frame, "split"):
        if (size.batch, size.hidden) == (batch, hidden):
            return estimate_inputs(r1, r2, link, size.output_bytes(r2["dtype"]))
    raise LabInputError(f"size {batch}x{hidden} was not measured in both modes")


@dataclass(frozen=True)
class BreakEven:
    """Where the split starts to win: layer work (flops) and one-rank compute C (ms) at T2 = T1.

    NaN values with a `reason` when the curves do not cross inside the measured range
    (math.inf when the split never wins there, 0 when it already wins at the smallest size).
    """

    work_flops: float
    C_ms: float
    reason: str = ""


def _log_interp(x0, x1, f0, f1):
    """x where the line through (log x0, f0), (log x1, f1) reaches f = 0."""
    t = f0 / (f0 - f1)
    return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0)))


def break_even(table: pd.DataFrame, t2_column: str = "T2_ms") -> BreakEven:
    """The size where T2 falls below T1: the last crossing from slower to faster along the work
    axis, interpolated in log(T2 / T1) against log(work). `t2_column`: "T2_ms" (measured) or
    "T2_pred_ms" (after the fact) of a validation_table, or "T2_eta1_ms" / "T2_apriori_ms" of an
    apriori_table (against its own T1_ms, the run it predicts from)."""
    rows = table.sort_values("work_flops")
    work = rows["work_flops"].to_numpy(float)
    c = rows["C_ms"].to_numpy(float)
    f = np.log(rows[t2_column].to_numpy(float) / rows["T1_ms"].to_numpy(float))
    if len(f) == 0:
        return BreakEven(math.nan, math.nan, "no measurements")
    if np.all(f > 0):
        return BreakEven(math.inf, math.inf, "the split is slower at every size measured: never in this range")
    if np.all(f <= 0):
        return BreakEven(0.0, 0.0, "the split already wins at the smallest size measured")
    for i in range(len(f) - 2, -1, -1):
        if f[i] > 0 >= f[i + 1]:
            return BreakEven(_log_interp(work[i], work[i + 1], f[i], f[i + 1]),
                             _log_interp(c[i], c[i + 1], f[i], f[i + 1]) if c[i] > 0 and c[i + 1] > 0 else math.nan)
    return BreakEven(math.inf, math.inf, "the split wins only at small sizes here: no crossing to a lasting win")


def overlap_table(frame: pd.DataFrame, link) -> pd.DataFrame:
    """Chunked split steps ("overlap" rows) against the no-overlap and the perfect-overlap estimates.

    For k chunks: Q = k all-reduces of V/k bytes; no overlap: S + C/(2 eta) + k(l + V/(k B));
    perfect overlap (column ideal_overlap_ms, the article's best case, an estimate that assumes
    nothing contends): S + max(C/(2 eta), k(l + V/(k B))). eta comes from the k = 1 run (nothing to overlap).
    """

    pairs = sorted(_pairs(frame, "overlap"), key=lambda p: int(p[1].chunks))
    if not pairs or int(pairs[0][1].chunks) != 1:
        raise LabInputError("the overlap runs need chunks=1 among them (the run with nothing to overlap)")
    one, base, size = pairs[0]
    v = size.output_bytes(base["dtype"])
    rows = []
    for _, r, _ in pairs:
        q = int(r.chunks)
        inp = estimate_inputs(one, base, link, v / q, Q=q)
        rows.append({"chunks": q, "measured_ms": float(r.step_ms), "compute_ms": float(r.compute_ms),
                     "exposed_comm_ms": float(r.communication_ms),
                     "no_overlap_ms": float(budget.t_two_ms(*inp.as_args())),
                     "ideal_overlap_ms": float(budget.ideal_overlap_ms(*inp.as_args())), "T1_ms": float(one.step_ms)})
    return pd.DataFrame(rows)


def replicas_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Same two devices, two goals: the latency of one batch against rows finished per second.

    "one device": the whole layer alone; "two replicas": each rank the whole layer on its own
    batch (twice the rows per step); "one split layer": both ranks on one batch.
    """
    rows = []
    for name, mode, batches in (("one device", "whole", 1), ("two replicas", "replica", 2),
                                ("one split layer", "split", 1)):
        for _, r in per_size(frame, mode).iterrows():
            rows.append({"setup": name, "batch": int(r.batch), "hidden": int(r.hidden),
                         "latency_ms": float(r.step_ms),
                         # to the row per second: the figures below that are timer noise
                         "throughput_rows_per_s": round(batches * int(r.batch) / (float(r.step_ms) / 1e3))})
    return pd.DataFrame(rows)


def describe_break_even(b: BreakEven) -> str:
    """"88.6 MFLOP (one-rank compute C = 1.92 ms)", or the reason when there is no crossing: three
    figures each, trailing zeros kept ("95.0 MFLOP", `_three_figures`), so that the rows of a table read alike."""
    if not math.isfinite(b.work_flops) or b.work_flops == 0:
        return b.reason
    return f"{_three_figures(b.work_flops / 1e6)} MFLOP (one-rank compute C = {_three_figures(b.C_ms)} ms)"


def _three_figures(x: float) -> str:
    """`x` (> 0) to three significant figures, trailing zeros kept and no bare point: 95 -> '95.0',
    245 -> '245', 3.8 -> '3.80', 1234.5 -> '1234' (no exponent)."""
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


# The predictions of T2 side by side: (view, column of compare_views, its error column, where eta comes from).
VIEWS = (("a priori, eta = 1", "T2_eta1_ms", "err_eta1", "stated before the split: perfect halves"),
         ("a priori, eta from the halves", "T2_apriori_ms", "err_apriori",
          "a separate run of the split's halves without communication, before the split"),
         ("after the fact", "T2_after_ms", "err_after",
          "the split run itself: its compute is read back, only S and l + V/B are predicted"))


def compare_views(apriori: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Per size in both: the measured T2 of `table` (validation_table) against the a-priori
    predictions of `apriori` (apriori_table) and the after-the-fact one.

    Columns: batch, hidden, work_flops, T1_ms and T2_ms (measured in the split run), eta_halves
    (a priori), eta_measured (from the split run), T2_eta1_ms, T2_apriori_ms, T2_after_ms, and for
    each prediction its error (predicted - measured) / measured: err_eta1, err_apriori, err_after.
    """
    after = table[["batch", "hidden", "work_flops", "T1_ms", "T2_ms", "eta_measured", "T2_pred_ms"]]
    prior = apriori[["batch", "hidden", "eta_halves", "T2_eta1_ms", "T2_apriori_ms"]]
    views = after.rename(columns={"T2_pred_ms": "T2_after_ms"}).merge(prior, on=["batch", "hidden"])
    if views.empty:
        raise LabInputError("the a-priori run and the split run share no layer size")
    for _, t2, err, _ in VIEWS:
        views[err] = (views[t2] - views["T2_ms"]) / views["T2_ms"]
    order = ["batch", "hidden", "work_flops", "T1_ms", "T2_ms", "eta_halves", "eta_measured",
             *(v[1] for v in VIEWS), *(v[2] for v in VIEWS)]
    return views[order].sort_values("work_flops").reset_index(drop=True)


def views_summary(apriori: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """One row per view of T2 (VIEWS) and one for the measurement: where eta came from, the median
    |predicted - measured| / measured of T2 in % over the sizes in both tables, and the break-even
    (work in MFLOP and as text). An a-priori break-even is where its T2 crosses the one-rank T1 of
    the run it was predicted from; the measured one where the split run's T2 crosses its T1.

    Columns: view, eta_from, median_abs_T2_error_pct, break_even_MFLOP, break_even.
    """
    views = compare_views(apriori, table)
    found = {"T2_eta1_ms": break_even(apriori, "T2_eta1_ms"), "T2_apriori_ms": break_even(apriori, "T2_apriori_ms"),
             "T2_after_ms": break_even(table, "T2_pred_ms")}
    rows = [(name, source, 100 * float(np.median(np.abs(views[err]))), found[t2]) for name, t2, err, source in VIEWS]
    rows.append(("measured", "", math.nan, break_even(table)))
    return pd.DataFrame([{"view": name, "eta_from": source, "median_abs_T2_error_pct": error,
                          "break_even_MFLOP": b.work_flops / 1e6, "break_even": describe_break_even(b)}
                         for name, source, error, b in rows])


def summary_table(link, table: pd.DataFrame, measured: BreakEven, predicted: BreakEven,
                  apriori: pd.DataFrame | None = None) -> pd.DataFrame:
    """The hand-in table: the link, the break-even (measured; predicted a priori when `apriori`,
    an apriori_table, is given; predicted after the fact: `predicted`), the best speedup and the
    median T2 errors of the views."""
    best = table.loc[table["speedup"].idxmax()]
    show = describe_break_even
    items = [("link", f"{link.backend}/{link.device}, {link.world_size} ranks: "
                      f"latency {link.latency_ms * 1e3:.0f} us, "
                      f"busbw {link.busbw_GBps:.3g} GB/s"),
             ("break-even, measured", show(measured))]
    if apriori is not None:
        items.append(("break-even, a priori (eta from the halves; C timed before the split)",
                      show(break_even(apriori, "T2_apriori_ms"))))
    items += [("break-even, after the fact (C timed beside the split)", show(predicted)),
              ("best measured speedup", f"{best.speedup:.2f}x at {int(best.batch)}x{int(best.hidden)} "
                                        f"(eta {best.eta:.2f})")]
    if apriori is not None:
        error = float(np.median(np.abs(compare_views(apriori, table)["err_apriori"])))
        items.append(("median |T2 error|, a priori (eta from the halves)", f"{100 * error:.1f}%"))
    items.append(("median |T2 error|, after the fact (eta from the split run)",
                  f"{100 * float(np.median(np.abs(table['rel_error']))):.1f}%"))
    return pd.DataFrame(items, columns=["quantity", "value"])


# --- 4. what the run showed, in words built from its numbers ---------------------------------------------

# The three terms of T2 = S + C/(2 eta) + Q(l + V/B) an error can come from: (column of error_terms, name).
TERMS = (("S_pct", "the serial part S"), ("compute_pct", "the compute C/(2 eta)"),
         ("communication_pct", "the communication l + V/B"))


def error_terms(apriori: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Which term of T2 each view gets wrong: per view, the median |T2 error| and each term's share.

    Per size, predicted - measured T2 splits exactly into three terms: S against the split's
    serial part S2 (slowest rank), C/(2 eta) against the split's compute C_rank (slowest rank),
    and Q(l + V/B) against the rest of the measured step, T2 - S2 - C_rank (the all-reduce, the
    wait for the slower rank and the gaps between the parts). Each term is (predicted - measured)
    in % of the measured T2, its median over the sizes in both tables: negative when the budget
    predicted too little. Terms of opposite sign partly cancel, so they can exceed the error. After
    the fact, C/(2 eta) *is* C_rank whenever eta <= 1, so its compute term is 0 there.

    Rows: "a priori" (eta from the halves run) and "after the fact". Columns: view,
    median_abs_T2_error_pct, S_pct, compute_pct, communication_pct, driver (the name in TERMS of
    the term of the largest magnitude).
    """
    keys = ["batch", "hidden"]
    measured = table[[*keys, "T2_ms", "S2_ms", "C_rank_ms"]]
    prior = apriori[[*keys, "S_ms", "C_ms", "eta_halves", "comm_pred_ms"]].assign(
        eta=lambda d: d["eta_halves"].clip(upper=1.0))
    views = {"a priori": measured.merge(prior, on=keys),
             "after the fact": measured.merge(table[[*keys, "S_ms", "C_ms", "eta", "comm_pred_ms"]], on=keys)}
    rows = []
    for view, d in views.items():
        if d.empty:
            raise LabInputError("the a-priori run and the split run share no layer size")
        t2 = d["T2_ms"]
        parts = {"S_pct": d["S_ms"] - d["S2_ms"], "compute_pct": d["C_ms"] / (2 * d["eta"]) - d["C_rank_ms"],
                 "communication_pct": d["comm_pred_ms"] - (t2 - d["S2_ms"] - d["C_rank_ms"])}
        error = sum(parts.values())
        shares = {k: 100 * float(np.median(v / t2)) for k, v in parts.items()}
        driver = max(TERMS, key=lambda t: abs(shares[t[0]]))[1]
        rows.append({"view": view, "median_abs_T2_error_pct": 100 * float(np.median(np.abs(error / t2))),
                     **shares, "driver": driver})
    return pd.DataFrame(rows)


def _pct(x: float) -> str:
    return f"{x:.1f}%"


def _term_clause(row) -> str:
    """"the communication l + V/B, predicted too low (-12.0% of the measured T2; the compute C/(2 eta)
    +2.0%, the serial part S +0.5%)"."""
    main = next(c for c, name in TERMS if name == row["driver"])
    others = ", ".join(f"{name} {row[c]:+.1f}%" for c, name in TERMS if c != main)
    side = "too low" if row[main] < 0 else "too high"
    return f"{row['driver']}, predicted {side} ({row[main]:+.1f}% of the measured T2; {others})"


def errors_sentence(terms: pd.DataFrame) -> str:
    """Which prediction of T2 was closer and which term drove each error, from `error_terms`.

    The errors compare at the 0.1 % they are printed with: equal there is a tie. Each term is
    (predicted - measured) in % of the measured T2 (median over sizes, see `error_terms`).
    """
    rows = terms.set_index("view")
    pri, aft = rows.loc["a priori"], rows.loc["after the fact"]
    a, b = _pct(pri["median_abs_T2_error_pct"]), _pct(aft["median_abs_T2_error_pct"])
    if a == b:
        first = f"The two predictions of T2 were off by the same median {a}"
    elif float(a[:-1]) < float(b[:-1]):
        first = f"The a-priori prediction of T2 was the closer: median error {a} against {b} after the fact"
    else:
        first = f"The after-the-fact prediction of T2 was the closer: median error {b} against {a} a priori"
    return (f"{first}. The largest term of the a-priori error: {_term_clause(pri)}. Of the after-the-fact "
            f"error: {_term_clause(aft)}.")


def pays_sentence(row) -> str:
    """Whether the split paid for one size of a validation_table, measured, and what the budget said.

    The speedups compare at the two decimals they are printed with: 1.00x is "as fast".
    """
    def verdict(speedup: float) -> str:
        shown = f"{speedup:.2f}"
        if shown == "1.00":
            return f"{shown}x: as fast as one device"
        return f"{shown}x: {'it pays' if speedup > 1 else 'it does not pay'}"
    size = f"{int(row['batch'])}x{int(row['hidden'])}"
    return (f"Layer {size}: measured, the split took {row['T2_ms']:.3g} ms against {row['T1_ms']:.3g} ms on one "
            f"device ({verdict(row['T1_ms'] / row['T2_ms'])}); the budget, with this row's inputs, predicted "
            f"{row['T2_pred_ms']:.3g} ms ({verdict(row['T1_ms'] / row['T2_pred_ms'])}).")


def overlap_sentence(overlap: pd.DataFrame) -> str:
    """What cutting the batch into chunks bought, from an overlap_table: the fastest chunk count
    above 1 against k = 1, measured. Within 0.5 % of k = 1 is "the same"."""
    base = float(overlap.loc[overlap["chunks"] == 1, "measured_ms"].iloc[0])
    more = overlap[overlap["chunks"] > 1]
    best = more.loc[more["measured_ms"].idxmin()]
    k, ratio = int(best["chunks"]), float(best["measured_ms"]) / base
    if ratio < 0.995:
        return (f"Overlap bought {1 - ratio:.0%}: k = {k} chunks took {best['measured_ms']:.3g} ms against "
                f"{base:.3g} ms with k = 1 (no-overlap estimate {best['no_overlap_ms']:.3g} ms, "
                f"perfect-overlap estimate {best['ideal_overlap_ms']:.3g} ms).")
    if ratio <= 1.005:
        return (f"Overlap bought nothing measurable: k = {k} chunks took {best['measured_ms']:.3g} ms, the same "
                f"as k = 1 within 0.5%.")
    return (f"Overlap bought nothing here: every chunk count took longer than k = 1 ({base:.3g} ms); the "
            f"fastest of them, k = {k}, took {ratio - 1:.0%} longer.")


def _compared(a: float, b: float, more: str, less: str, same: str) -> str:
    """`more`, `less` or `same` as a against b, equal at the 3 figures they are printed with."""
    return same if f"{a:.3g}" == f"{b:.3g}" else (more if a > b else less)


def replicas_sentence(replicas: pd.DataFrame) -> str:
    """Two replicas against one split layer for the largest size of a replicas_table: rows per
    second and the wait of one batch, each against one device, compared at 3 figures; a replica's
    wait also in percent of one device's (the replicas share the machine, so it is rarely equal)."""
    big = replicas[replicas["hidden"] == replicas["hidden"].max()].set_index("setup")
    one, rep, split = (big.loc[s] for s in ("one device", "two replicas", "one split layer"))
    thr = {s: float(big.loc[s, "throughput_rows_per_s"]) / float(one["throughput_rows_per_s"]) for s in big.index}
    rows = _compared(thr["two replicas"], thr["one split layer"], "the replicas finish more rows per second",
                     "the split finishes more rows per second", "both finish as many rows per second")
    wait = _compared(float(split["latency_ms"]), float(one["latency_ms"]), "later than", "sooner than", "as soon as")
    return (f"Layer {int(one['batch'])}x{int(one['hidden'])}: {rows} (two replicas {thr['two replicas']:.2f}x, "
            f"the split {thr['one split layer']:.2f}x one device's); the split answers one batch {wait} one "
            f"device ({split['latency_ms']:.3g} ms against {one['latency_ms']:.3g} ms; a replica "
            f"{rep['latency_ms']:.3g} ms, {_replica_wait(float(rep['latency_ms']), float(one['latency_ms']))}).")


def _replica_wait(replica_ms: float, one_ms: float) -> str:
    """A replica's wait for its batch against one device alone, in percent as printed: the two
    replicas run at once on one machine, so they share its memory bandwidth and caches."""
    pct = round(100 * (replica_ms / one_ms - 1))
    if pct == 0:
        return "as long as on one device alone"
    return f"{abs(pct)}% {'longer' if pct > 0 else 'shorter'} than on one device alone"
