"""Tensor parallelism, drawn (notebooks 06, 07 and 09): one split step per rank, the precision of a split
layer, the budget held against the measured split layer, and what overlap saved."""

from __future__ import annotations

import math

import numpy as np

from labutils.show.plots import PALETTE, new_figure

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
    err.set_xlabel("layer (tokens x hidden)")
    err.set_ylabel("(predicted - measured) / measured (%)")
    return axes


def tp_overlap_bars(table, ax=None):
    """Per chunk count: measured step, the no-overlap and the perfect-overlap estimates (ms)."""
    if ax is None:
        _, ax = new_figure()
    xs = np.arange(len(table))
    for j, (col, label, colour) in enumerate((("measured_ms", "measured", PALETTE[0]),
                                              ("no_overlap_ms", "predicted, no overlap", PALETTE[3]),
                                              ("ideal_overlap_ms", "perfect-overlap estimate", PALETTE[2]))):
        ax.bar(xs + (j - 1) * 0.27, table[col], 0.27, color=colour, label=label)
    ax.axhline(float(table["T1_ms"].iloc[0]), color=PALETTE[7], linestyle="--", label="T1 (one rank)")
    ax.set_xticks(xs, [str(k) for k in table["chunks"]])
    ax.set_xlabel("chunks (one asynchronous all-reduce each)")
    ax.set_ylabel("median step time (ms)")
    ax.legend(fontsize=8)
    return ax
