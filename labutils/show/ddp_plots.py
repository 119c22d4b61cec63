"""Data-parallel training, drawn (notebook 08 and its scaling dashboard): where one step's time went,
the predicted step against the measured one, the bucket sweep, and predicted efficiency curves."""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from labutils.model.ddp_model import predicted_efficiency
from labutils.show.plots import PALETTE, bytes_axis, new_figure

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
