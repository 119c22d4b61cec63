"""Data-parallel training, drawn (notebook 10): where one step's time went, the predicted step against
the measured one, the bucket sweep, predicted efficiency curves, and the scaling dashboard that
moves them (`ddp_scaling_dashboard`: sliders for gradient size, link, compute, latency, buckets and
overlap over `labutils.model.ddp_model`, the pattern of `labutils.show.dashboard`)."""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as w
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from labutils.measure.my_link import load_link
from labutils.model.ddp_model import predicted_efficiency
from labutils.model.fit import ARTICLE_BUSBW_GBps, allreduce_ms
from labutils.show.dashboard import LABEL, WIDTH, Dashboard, agg_figure, figure_png, layout
from labutils.show.plots import PALETTE, apply_style, bytes_axis, new_figure

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
    """Measured N-rank steps (dots) against the two estimates, no overlap (the sum) and ideal overlap
    (the max): estimates without contention or stragglers, which a measured step may lie outside."""
    if ax is None:
        _, ax = new_figure()
    for mode, marker, colour in (("ddp", "o", PALETTE[0]), ("no_overlap", "s", PALETTE[3])):
        rows = table[table["mode"] == mode].sort_values(x)
        if rows.empty:
            continue
        ax.plot(rows[x], rows["measured_ms"], marker, color=colour, label=f"measured: {mode}")
        if mode == "ddp":
            ax.fill_between(rows[x], rows["overlap_pred_ms"], rows["no_overlap_pred_ms"], color=colour, alpha=0.15,
                            label="estimates: ideal overlap to no overlap")
        else:
            ax.plot(rows[x], rows["no_overlap_pred_ms"], "--", color=colour, label="no-overlap estimate")
    if x == "gradient_bytes":

        bytes_axis(ax, label="gradient size (bytes, 1024-based)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("step time (ms)")
    ax.set_title("N-rank step: measured against the two estimates")
    ax.legend()
    return ax


def ddp_bucket_sweep(table, ax=None):
    """DDP step time against `bucket_cap_mb`, measured and the two estimates, for one model."""
    if ax is None:
        _, ax = new_figure()
    rows = table[table["mode"] == "ddp"].sort_values("bucket_cap_mb")
    ax.plot(rows["bucket_cap_mb"], rows["measured_ms"], "o-", color=PALETTE[0], label="measured DDP step")
    ax.plot(rows["bucket_cap_mb"], rows["no_overlap_pred_ms"], "--", color=PALETTE[3],
            label="no-overlap estimate (buckets x latency + wire)")
    ax.plot(rows["bucket_cap_mb"], rows["overlap_pred_ms"], ":", color=PALETTE[2], label="ideal-overlap estimate")
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


def ddp_scaling_dashboard(gradient_bytes: float = 200e6, busbw_GBps: float | None = None,
                          compute_ms: float = 100.0, alpha_us: float | None = None, buckets: int = 8,
                          hideable: float = 0.0, scaling: str = "weak", world_sizes=(2, 4, 8), dpi: int = 80):
    """Sliders for gradient size, link bandwidth, compute, latency, buckets and overlap; the
    predicted scaling efficiency for N = 2, 4, 8 as a readout and as curves against gradient size.

    busbw and alpha default to the measured link (`labutils.measure.my_link.load_link`), else the article's
    22 GB/s and no latency. Returns a `DDPScalingDashboard`: set `dash.sliders["busbw_GBps"].value`
    and read `dash.state()["efficiency"][8]` or the readout's `[data-key=efficiency-N8]`.
    """
    link = load_link() if busbw_GBps is None or alpha_us is None else None
    source = link.name if link is not None else "the article's 22 GB/s link"
    busbw_GBps = busbw_GBps if busbw_GBps is not None else (link.busbw_GBps if link else ARTICLE_BUSBW_GBps)
    alpha_us = alpha_us if alpha_us is not None else (link.alpha_us if link else 0.0)
    # continuous_update off: exact values, as the budget sliders
    style = {"style": LABEL, "layout": w.Layout(width=WIDTH), "continuous_update": False}
    sliders = {
        "gradient_bytes": w.FloatLogSlider(value=gradient_bytes, base=10, min=5, max=10.5, step=0.01,
                                           description="gradient (bytes)", readout_format=".3g", **style),
        "busbw_GBps": w.FloatLogSlider(value=busbw_GBps, base=10, min=-1, max=3, step=0.01,
                                       description="link busbw (GB/s)", readout_format=".3g", **style),
        "compute_ms": w.FloatLogSlider(value=compute_ms, base=10, min=-1, max=4, step=0.01,
                                       description="one-rank compute (ms)", readout_format=".3g", **style),
        "alpha_us": w.FloatSlider(value=alpha_us, min=0, max=max(2000.0, alpha_us), step=1,
                                  description="latency α (µs)", readout_format=".0f", **style),
        "buckets": w.IntSlider(value=buckets, min=1, max=64, description="buckets", **style),
        "hideable": w.FloatSlider(value=hideable, min=0, max=1, step=0.05, description="hideable share",
                                  readout_format=".2f", **style),
        "scaling": w.ToggleButtons(options=["weak", "strong"], value=scaling, description="scaling"),
    }
    apply_style()
    figure = agg_figure(dpi, left=0.1, right=0.97, bottom=0.14, top=0.9)
    box, readout, image = layout(list(sliders.values()), "600px")
    dash = DDPScalingDashboard(sliders, readout, image, figure, box, {}, tuple(world_sizes), source)
    dash.watch(sliders.values())
    return dash


@dataclass(frozen=True)
class DDPScalingDashboard(Dashboard):
    """The data-parallel widget (the pattern of `labutils.show.dashboard.Dashboard`): `sliders` by input
    name, `readout` (HTML), `image` (PNG); `state()` holds values, efficiency {N: 0..1}, comm_ms
    {N: ms} and error (None when all went well)."""
    world_sizes: tuple
    source: str

    def values(self) -> dict:
        return {k: (s.value if k == "scaling" else float(s.value)) for k, s in self.sliders.items()}

    def compute(self, values: dict) -> dict:
        v = values
        eff = {n: float(predicted_efficiency(v["gradient_bytes"], v["busbw_GBps"], v["compute_ms"], n,
                                             v["alpha_us"], v["buckets"], v["hideable"], v["scaling"]))
               for n in self.world_sizes}
        comm = {n: float(allreduce_ms(v["gradient_bytes"], n, v["busbw_GBps"], v["alpha_us"], v["buckets"]))
                for n in self.world_sizes}
        return {"efficiency": eff, "comm_ms": comm}

    def draw(self, values: dict, numbers: dict) -> bytes:
        if "_art" not in self._state:
            self._state["_art"] = ddp_efficiency_curves(self.figure.add_subplot(), values, self.world_sizes)
        update_ddp_efficiency_curves(self._state["_art"], values)
        return figure_png(self.figure)

    def readout_html(self, values: dict, numbers: dict) -> str:
        eff, comm = numbers["efficiency"], numbers["comm_ms"]
        rows = "".join(f'<tr><th>N = {n}</th><td data-key="efficiency-N{n}" data-value="{eff[n]!r}">'
                       f"{eff[n]:.0%}</td><td>speedup {eff[n] * n:.2f}x</td>"
                       f'<td data-key="comm-N{n}" data-value="{comm[n]!r}">all-reduce {comm[n]:.3g} ms</td></tr>'
                       for n in self.world_sizes)
        return (f'<div class="lab-readout" data-scaling="{values["scaling"]}"><table>{rows}</table>'
                f"<p>Link preset: {html.escape(self.source)}. Efficiency = one-rank step / N-rank step "
                f"({'same batch per rank' if values['scaling'] == 'weak' else 'same global batch'}).</p>"
                "<p><i>A prediction from the model, not a measurement.</i></p></div>")
