"""Training figures: the data-parallel step (notebook 08, and the scaling dashboard in
`labutils.show.widgets`) and the split layer (notebooks 05 and 07). The look is `labutils.show.plots`'; the
arithmetic is `labutils.model.ddp_model`'s and `labutils.experiments.tensor_parallel`'s.
"""

from __future__ import annotations

import math

import numpy as np

from labutils.model.ddp_model import predicted_efficiency
from labutils.show.plots import PALETTE, bytes_axis, new_figure

# --- data-parallel figures ---
DDP_PARTS = ("forward", "backward", "wait for slowest rank", "exposed comm", "optimizer", "other")


def ddp_time_breakdown(breakdown, ax=None, title: str = "Where one training step's time went"):
    """Stacked horizontal bars, one per configuration, from `data_parallel.time_breakdown` (ms)."""
    if ax is None:
        _, ax = new_figure(figsize=(8.0, 0.55 * len(breakdown) + 1.6))
    left = [0.0] * len(breakdown)
    colours = dict(zip(DDP_PARTS, [PALETTE[0], PALETTE[5], PALETTE[1], PALETTE[3], PALETTE[2], PALETTE[7]]))
    labels = list(breakdown.index)
    for part in DDP_PARTS:
        widths = [max(0.0, float(v)) for v in breakdown[part]]
        ax.barh(labels, widths, left=left, color=colours[part], label=part, height=0.6)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("median time per step (ms)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title)
    return ax


def ddp_prediction_vs_measured(table, ax=None, x: str = "gradient_bytes"):
    """Measured N-rank steps (dots) between the predicted no-overlap (sum) and overlap (max) bounds."""
    if ax is None:
        _, ax = new_figure()
    for mode, marker, colour in (("ddp", "o", PALETTE[0]), ("no_overlap", "s", PALETTE[3])):
        rows = table[table["mode"] == mode].sort_values(x)
        if rows.empty:
            continue
        ax.plot(rows[x], rows["measured_ms"], marker, color=colour, label=f"measured: {mode}")
        if mode == "ddp":
            ax.fill_between(rows[x], rows["overlap_pred_ms"], rows["no_overlap_pred_ms"], color=colour, alpha=0.15,
                            label="predicted range: ideal overlap .. none")
        else:
            ax.plot(rows[x], rows["no_overlap_pred_ms"], "--", color=colour, label="predicted: no overlap")
    if x == "gradient_bytes":
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        bytes_axis(ax, label="gradient size (bytes, 1024-based)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("step time (ms)")
    ax.set_title("N-rank step: measured against the predicted bounds")
    ax.legend()
    return ax


def ddp_bucket_sweep(table, ax=None):
    """DDP step time against `bucket_cap_mb`, measured and predicted, for one model."""
    if ax is None:
        _, ax = new_figure()
    rows = table[table["mode"] == "ddp"].sort_values("bucket_cap_mb")
    ax.plot(rows["bucket_cap_mb"], rows["measured_ms"], "o-", color=PALETTE[0], label="measured DDP step")
    ax.plot(rows["bucket_cap_mb"], rows["no_overlap_pred_ms"], "--", color=PALETTE[3],
            label="predicted, no overlap (buckets x latency + wire)")
    ax.plot(rows["bucket_cap_mb"], rows["overlap_pred_ms"], ":", color=PALETTE[2], label="predicted, ideal overlap")
    for _, r in rows.iterrows():
        ax.annotate(f"{int(r['buckets'])} bucket(s)", (r["bucket_cap_mb"], r["measured_ms"]),
                    textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bucket_cap_mb (MiB)")
    ax.set_ylabel("step time (ms)")
    ax.legend()
    return ax


def ddp_efficiency_curves(ax, params: dict, world_sizes=(2, 4, 8), points: int = 80) -> dict:
    """Predicted scaling efficiency against gradient size for each N; returns artists to update."""
    sizes = np.logspace(5, 10.5, points)
    art = {"sizes": sizes, "lines": {}, "world_sizes": tuple(world_sizes)}
    for k, n in enumerate(world_sizes):
        (art["lines"][n],) = ax.plot(sizes, sizes * 0 + 1, color=PALETTE[k], label=f"N = {n}")
    art["marker"] = ax.axvline(params["gradient_bytes"], color=PALETTE[7], ls=":", label="this gradient")
    bytes_axis(ax, label="gradient size (bytes, 1024-based)")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("predicted scaling efficiency")
    ax.legend(loc="lower left")
    art["ax"] = ax
    update_ddp_efficiency_curves(art, params)
    return art


def update_ddp_efficiency_curves(art: dict, params: dict) -> None:
    """Move the curves and the marker of `ddp_efficiency_curves` to new inputs (same artists)."""

    keys = ("busbw_GBps", "compute_ms", "alpha_us", "buckets", "hideable", "scaling")
    for n, line in art["lines"].items():
        line.set_ydata(predicted_efficiency(art["sizes"], world_size=n, **{k: params[k] for k in keys}))
    art["marker"].set_xdata([params["gradient_bytes"]] * 2)
    art["ax"].set_title(f"{params['scaling']} scaling, busbw {params['busbw_GBps']:.3g} GB/s, "
                        f"compute {params['compute_ms']:.3g} ms")


# --- tensor-parallel figures ---
TP_PARTS = ("compute", "communication", "serial")


def tp_step_breakdown(frame, ax=None, title: str = "One split step, per rank"):
    """Stacked horizontal bars of compute / communication / serial (median ms), one per row of
    `frame` (columns rank or label, compute_ms, communication_ms, serial_ms)."""
    if ax is None:
        _, ax = new_figure(figsize=(7.5, 0.6 * len(frame) + 1.6))
    labels = [str(v) for v in (frame["label"] if "label" in frame else [f"rank {r}" for r in frame["rank"]])]
    left = [0.0] * len(frame)
    for part, colour in zip(TP_PARTS, (PALETTE[0], PALETTE[3], PALETTE[7])):
        widths = [max(0.0, float(v)) for v in frame[f"{part}_ms"]]
        ax.barh(labels, widths, left=left, color=colour, label=part, height=0.6)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("median time per step (ms)")
    ax.legend(ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.15 - 0.15 / len(frame)))
    ax.set_title(title)
    return ax


def tp_precision_bars(frame, ax=None):
    """Relative error against float64 per dtype and summation order: bar = max, dot = mean, on a
    log axis; the dtype's tolerance as a dashed line."""
    if ax is None:
        _, ax = new_figure(figsize=(8.5, 4.2))
    orders = list(dict.fromkeys(zip(frame["shards"], frame["order"])))
    dtypes = list(dict.fromkeys(frame["dtype"]))
    width = 0.8 / len(orders)
    for j, (shards, order) in enumerate(orders):
        rows = frame[(frame["shards"] == shards) & (frame["order"] == order)].set_index("dtype").reindex(dtypes)
        xs = np.arange(len(dtypes)) + (j - (len(orders) - 1) / 2) * width
        label = "whole" if shards == 1 else f"{shards} shards, {order}"
        ax.bar(xs, rows["max_rel"], width, color=PALETTE[j % len(PALETTE)], label=label)
        ax.plot(xs, rows["mean_rel"], "k.", markersize=4)
    for i, dtype in enumerate(dtypes):
        tolerance_for_two = frame[(frame["dtype"] == dtype) & (frame["shards"] <= 2)]["tolerance"].max()
        ax.hlines(tolerance_for_two, i - 0.45, i + 0.45, colors="k", linestyles="--", linewidth=1)
    ax.set_xticks(range(len(dtypes)), dtypes)
    ax.set_yscale("log")
    ax.set_ylabel("difference to float64, relative to max|y|")
    ax.text(0.0, -0.14, "bar: max, dot: mean; dashed: the tolerance a 2-rank split is checked with",
            transform=ax.transAxes, fontsize=8)
    ax.legend(fontsize=8, ncol=min(4, len(orders)), loc="upper center", bbox_to_anchor=(0.5, -0.18))
    ax.set_title("Same layer, other dtype or summation order")
    return ax


def tp_validation(table, measured=None, predicted=None, axes=None):
    """Left: T1, measured T2 and predicted T2 against layer work (log-log), with the break-even
    sizes as vertical lines. Right: the relative prediction error of T2 per size."""
    if axes is None:
        _, axes = new_figure(1, 2, figsize=(11.0, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    ax, err = axes
    x = table["work_flops"] / 1e6
    ax.plot(x, table["T1_ms"], "o-", color=PALETTE[7], label="T1 measured (one rank, whole layer)")
    ax.plot(x, table["T2_ms"], "o-", color=PALETTE[0], label="T2 measured (two ranks, split)")
    ax.plot(x, table["T2_pred_ms"], "s--", color=PALETTE[3], label="T2 predicted (budget + measured link)")
    for b, colour, name in ((measured, PALETTE[0], "measured"), (predicted, PALETTE[3], "predicted")):
        if b is not None and math.isfinite(b.work_flops) and b.work_flops > 0:
            ax.axvline(b.work_flops / 1e6, color=colour, linestyle=":", label=f"break-even, {name}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("layer work (MFLOP, both linears)")
    ax.set_ylabel("median step time (ms)")
    ax.legend(fontsize=8)
    err.bar(range(len(table)), 100 * table["rel_error"], color=PALETTE[3])
    err.axhline(0, color="k", linewidth=0.8)
    for s in (-20, 20):
        err.axhline(s, color="k", linestyle=":", linewidth=0.8)
    err.set_xticks(range(len(table)), [f"{b}x{h}" for b, h in zip(table["batch"], table["hidden"])], rotation=45)
    err.set_xlabel("layer (batch x hidden)")
    err.set_ylabel("(predicted - measured) / measured (%)")
    return axes


def tp_overlap_bars(table, ax=None):
    """Per chunk count: measured step, the no-overlap prediction and the overlap lower bound (ms)."""
    if ax is None:
        _, ax = new_figure()
    xs = np.arange(len(table))
    for j, (col, label, colour) in enumerate((("measured_ms", "measured", PALETTE[0]),
                                              ("no_overlap_ms", "predicted, no overlap", PALETTE[3]),
                                              ("overlap_bound_ms", "lower bound, perfect overlap", PALETTE[2]))):
        ax.bar(xs + (j - 1) * 0.27, table[col], 0.27, color=colour, label=label)
    ax.axhline(float(table["T1_ms"].iloc[0]), color=PALETTE[7], linestyle="--", label="T1 (one rank)")
    ax.set_xticks(xs, [str(k) for k in table["chunks"]])
    ax.set_xlabel("chunks (one asynchronous all-reduce each)")
    ax.set_ylabel("median step time (ms)")
    ax.legend(fontsize=8)
    return ax
