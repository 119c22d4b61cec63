"""The data-parallel scaling dashboard (notebook 08): sliders for gradient size, link, compute,
latency, buckets and overlap over `labutils.model.ddp_model`, the pattern of `labutils.show.dashboard`."""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as w

from labutils.measure.my_link import load_link
from labutils.model.ddp_model import predicted_efficiency
from labutils.model.fit import ARTICLE_BUSBW_GBps, allreduce_ms
from labutils.show.dashboard import LABEL, WIDTH, Dashboard, agg_figure, figure_png, layout
from labutils.show.ddp_plots import ddp_efficiency_curves, update_ddp_efficiency_curves
from labutils.show.plots import apply_style


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
