"""The time budget drawn (notebook 08): the two split times against compute, serial dilution, the
perfect-overlap estimate and the thresholds, and the dashboard that moves them. The look is
`labutils.show.plots`'; the arithmetic is `labutils.model.budget`'s.

The time-budget dashboard (`budget_dashboard`) moves seven sliders, two toggles (the number of
devices N and the dtype on the wire) and a preset menu; each move recomputes
`labutils.model.budget.evaluate` (the article's two-device model at N = 2, fp32), updates one
matplotlib figure in place (the same artists, new data) and renders it to PNG into an
`ipywidgets.Image`, so it works in a plain JupyterLab (no ipympl) and never flickers. The readout
is an `ipywidgets.HTML` whose numbers sit in elements with `data-key` / `data-value` attributes,
for tests and browsers to read. An error inside a callback is shown in the readout (class
`lab-error`), never swallowed. It follows the pattern of `labutils.show.dashboard.Dashboard`:
controls -> pure compute -> readout and figure in place, as the data-parallel one in
`labutils.show.ddp_plots` does.
"""

from __future__ import annotations

import html
import io
import math
from dataclasses import dataclass

import ipywidgets as w
import numpy as np
from matplotlib.patches import Rectangle
from PIL import Image

from labutils.core.inputs import LabInputError
from labutils.measure.my_link import saved_links
from labutils.model.budget import BASE_CASE, check_devices, evaluate, verdict, wire_dtype_name
from labutils.readers.links import link_figures
from labutils.show.dashboard import LABEL, WIDTH, Dashboard, agg_figure, layout
from labutils.show.plots import PALETTE, apply_style, new_figure

# --- time budget figures ---

def _nice_limit(needed: float, current: float | None = None) -> float:
    """A round upper axis limit (1, 1.25, 1.5, 2, ... x 10^k) that holds `needed`; keeps `current`
    while it still fits and is not twice too large, so small moves leave the axes (and ticks) alone."""
    if current is not None and needed <= current <= 2 * needed:
        return current
    k = 10.0 ** math.floor(math.log10(needed))
    return next(m * k for m in (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * k >= needed)


def _split_label(N: int) -> str:
    return "two devices: T2 = S + C/(2η) + H" if N == 2 else f"{N} devices: T{N} = S + C/({N}η) + H{N}"


def budget_curves(ax, params: dict, budget=None, grid_points: int = 60, legend_outside: bool = False) -> dict:
    """Draw T1 and T2 against C on `ax`: break-even marked, the two regions shaded, the current C marked.

    `params` holds the seven inputs of `labutils.model.budget.evaluate`, and optionally its `n_devices`
    and `wire_dtype` (T_N is then drawn). Returns the artists, which
    `update_budget_curves` moves in place (no new artists, so a redraw never flickers).
    """
    art = {
        "t1": ax.plot([], [], color=PALETTE[0], lw=2, label="one device: T1 = S + C")[0],
        "t2": ax.plot([], [], color=PALETTE[1], lw=2, label=_split_label(params.get("n_devices", 2)))[0],
        "lose": ax.add_patch(Rectangle((0, 0), 0, 1, transform=ax.get_xaxis_transform(), color=PALETTE[3],
                                       alpha=0.10, lw=0, label="splitting loses")),
        "pay": ax.add_patch(Rectangle((0, 0), 0, 1, transform=ax.get_xaxis_transform(), color=PALETTE[2],
                                      alpha=0.12, lw=0, label="splitting pays")),
        "even_line": ax.axvline(0, color="0.35", ls="--", lw=1),
        "even_dot": ax.plot([], [], "o", color="0.2", label="break-even")[0],
        "now_line": ax.axvline(0, color=PALETTE[4], ls=":", lw=1.5),
        "now_dots": ax.plot([], [], "D", color=PALETTE[4], label="your C")[0],
    }
    ax.set_xlabel("divisible compute C (ms)")
    ax.set_ylabel("time of the operation (ms)")
    _budget_legend(ax, legend_outside)
    update_budget_curves(art, params, budget, grid_points)
    return art


def _budget_legend(ax, outside: bool) -> None:
    ax.legend(**({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if outside else {"loc": "upper left"}))


def label_budget_curves(art: dict, N: int, legend_outside: bool = False) -> None:
    """Name N in the split curve's label and redraw the legend (the artists stay the same)."""
    art["t2"].set_label(_split_label(N))
    _budget_legend(art["t2"].axes, legend_outside)


def update_budget_curves(art: dict, params: dict, budget=None, grid_points: int = 60, sticky: bool = False,
                         numbers_in_title: bool = True):
    """Move the artists of `budget_curves` to new inputs; returns the Budget at the current C.

    `params` may hold `n_devices` and `wire_dtype` besides the seven inputs (N devices; 2 and fp32 are
    the article's model). With `sticky`, the axis limits change only when the curves outgrow
    them (see _nice_limit); without `numbers_in_title` the title is left alone (text is the
    slowest thing to redraw).
    """
    here = budget if budget is not None else evaluate(**params)
    ax, C, S = art["t1"].axes, params["C_ms"], params["S_ms"]
    even = here.break_even_C_ms
    xmax = _nice_limit(max(2.0 * C, 1.6 * even if math.isfinite(even) else 0.0, 1.0),
                       ax.get_xlim()[1] if sticky else None)
    grid = np.linspace(0.0, xmax, grid_points)
    curve = evaluate(**{**params, "C_ms": grid})
    art["t1"].set_data(grid, curve.t_one_ms)
    art["t2"].set_data(grid, curve.t_two_ms)
    split = min(even, xmax)
    art["lose"].set_width(split)
    art["pay"].set_x(split)
    art["pay"].set_width(xmax - split)
    for key in ("even_line", "even_dot"):
        art[key].set_visible(math.isfinite(even))
    art["even_line"].set_xdata([split, split])
    art["even_dot"].set_data([split], [S + split])
    art["now_line"].set_xdata([C, C])
    art["now_dots"].set_data([C, C], [here.t_one_ms, here.t_two_ms])
    ax.set_xlim(0.0, xmax)
    ax.set_ylim(0.0, _nice_limit(1.05 * max(curve.t_one_ms[-1], curve.t_two_ms[-1]),
                                 ax.get_ylim()[1] if sticky else None))
    if numbers_in_title:
        shown = "never" if math.isinf(even) else f"{even:.3g} ms"
        ax.set_title(f"speedup {here.speedup:.3g}x at C = {C:.3g} ms; break-even C: {shown}")
    return here


def plot_budget_vs_C(params: dict):
    """T1 and T2 against C for these inputs, as a new figure."""
    fig, ax = new_figure()
    budget_curves(ax, params)
    fig.tight_layout()
    return fig


def plot_serial_dilution(params: dict, S_values_ms):
    """Speedup against the serial time S (log axis), the rest fixed: S shrinks the benefit."""
    S = np.asarray(S_values_ms, dtype=float)
    fig, ax = new_figure()
    ax.plot(S, evaluate(**{**params, "S_ms": S}).speedup, lw=2, label=f"C = {params['C_ms']:g} ms")
    for s in (params["S_ms"],):
        here = evaluate(**params)
        ax.plot([s], [here.speedup], "o", color=PALETTE[3], label=f"S = {s:g} ms: {here.speedup:.3g}x")
    ax.axhline(1.0, color="0.4", lw=1, ls="--", label="no gain (1x)")
    ax.set_xscale("log")
    ax.set_xlabel("serial time S (ms, log scale)")
    ax.set_ylabel("speedup T1/T2")
    ax.set_title("The same split, diluted by the part that cannot be split")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_ideal_overlap(params: dict, C_max_ms: float | None = None):
    """T1, T2 and the perfect-overlap estimate S + max(C/(2η), H) (the model's best case) against C."""
    C = np.linspace(0.0, C_max_ms or 2.0 * params["C_ms"], 200)
    b = evaluate(**{**params, "C_ms": C})
    fig, ax = new_figure()
    ax.plot(C, b.t_one_ms, lw=2, label="one device, T1")
    ax.plot(C, b.t_two_ms, lw=2, label="two devices, no overlap, T2")
    ax.plot(C, b.ideal_overlap_ms, lw=2, ls="--", label="perfect overlap (estimate)")
    ax.fill_between(C, b.ideal_overlap_ms, b.t_two_ms, color=PALETTE[2], alpha=0.15,
                    label="the most overlap could win back")
    ax.set_xlabel("divisible compute C (ms)")
    ax.set_ylabel("time of the operation (ms)")
    ax.set_title("Overlap hides communication at best; it never removes the longer block")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_thresholds(params: dict, links: dict | None = None, C_max_ms: float | None = None):
    """Two views of the same budget against C: the minimum bandwidth (log) and the minimum η.

    `links` maps a label to a bandwidth in GB/s drawn as a horizontal reference line.
    Where the answer is "never" (math.inf) the curve has no point and the region is shaded.
    """
    C = np.linspace(0.05, C_max_ms or 4.0 * params["C_ms"], 300)
    b = evaluate(**{**params, "C_ms": C})
    fig, (left, right) = new_figure(1, 2, figsize=(11, 4.2))
    never_b = np.isinf(b.min_bandwidth_GBps)
    left.plot(C[~never_b], b.min_bandwidth_GBps[~never_b], lw=2, label="minimum bandwidth")
    left.fill_between(C, 0, 1, where=never_b, transform=left.get_xaxis_transform(), color=PALETTE[3],
                      alpha=0.12, label="never: startups use up the saving")
    for i, (name, gbps) in enumerate((links or {}).items()):
        left.axhline(gbps, color=PALETTE[(i + 4) % len(PALETTE)], lw=1, ls=":", label=f"{name}: {gbps:g} GB/s")
    left.set_yscale("log")
    left.set_xlabel("divisible compute C (ms)")
    left.set_ylabel("minimum effective bandwidth (GB/s)")
    left.set_title(f"Which link is enough? (η = {params['eta']:g})")
    left.legend(fontsize=8)
    never_e = np.isinf(b.min_eta)
    right.plot(C[~never_e], np.minimum(b.min_eta[~never_e], 1.5), lw=2, label="minimum η (clipped at 1.5)")
    right.axhspan(1.0, 1.5, color=PALETTE[3], alpha=0.12, label="impossible: needs η > 1")
    right.axhline(params["eta"], color=PALETTE[1], ls="--", lw=1, label=f"your η = {params['eta']:g}")
    right.set_ylim(0.4, 1.5)
    right.set_xlabel("divisible compute C (ms)")
    right.set_ylabel("minimum local efficiency η")
    right.set_title(f"How efficient must each half be? (B = {params['bandwidth_GBps']:g} GB/s)")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class Preset:
    """A named set of the seven budget inputs, with where its figures come from."""
    name: str
    values: dict
    source: str


def _link_presets(base: dict) -> list[Preset]:

    presets = []
    for fig in link_figures():
        gbps = float(fig.low_GBps)
        presets.append(Preset(f"{fig.name}: {gbps:g} GB/s ({fig.low_kind})", {**base, "bandwidth_GBps": gbps},
                              f"{fig.low_kind}: the low end of the table's range ({fig.low_GBps:g}-"
                              f"{fig.high_GBps:g} GB/s, {fig.kind}). Source: {fig.source}. "
                              f"Startup l kept at the base case's {base['latency_ms']:g} ms (the table gives "
                              "bandwidth only)."))
    return presets


def _measured_presets(base: dict, directory=None) -> list[Preset]:
    return [Preset(name, {**base, **link.budget_params()}, source)
            for name, link, source in saved_links(directory)]


def budget_presets(directory=None) -> list[Preset]:
    """The preset menu: the article's base case, every link of data/link_table.csv (its low end, named
    with what that figure is: `links.LOW_KINDS`), then every
    measured link (results of kind "link": measured in notebook 02, fitted and saved by 05) found in results_dir()."""
    base = {k: float(v) for k, v in BASE_CASE.items()}
    return ([Preset("article base case: 10 GB/s (hypothetical)", base,
                    "hypothetical parameters of the source article's worked example (a model, not a card)")]
            + _link_presets(base) + _measured_presets(base, directory))


_SLIDERS = {
    "bandwidth_GBps": ("FloatLogSlider", "bandwidth B (GB/s)",
                       {"base": 10, "min": -1, "max": 3, "step": 0.01, "readout_format": ".3r"}),
    "eta": ("FloatSlider", "efficiency η", {"min": 0.05, "max": 1.0, "step": 0.01, "readout_format": ".2f"}),
    "latency_ms": ("FloatSlider", "startup ℓ (ms)", {"min": 0.0, "max": 2.0, "step": 0.001, "readout_format": ".3f"}),
    "C_ms": ("FloatSlider", "compute C (ms)", {"min": 0.0, "max": 100.0, "step": 0.1, "readout_format": ".1f"}),
    "S_ms": ("FloatSlider", "serial S (ms)", {"min": 0.0, "max": 200.0, "step": 0.1, "readout_format": ".1f"}),
    "Q": ("IntSlider", "exchanges Q", {"min": 0, "max": 64, "step": 1}),
    "volume_bytes": ("FloatLogSlider", "bytes per exchange V",
                     {"base": 10, "min": 3, "max": 10, "step": 0.01, "readout_format": ".4r"}),
}


_CONTROLS = {
    "N": ("devices N", ((" 2", 2), (" 4", 4), (" 8", 8)), 2),
    "wire_dtype": ("dtype on the wire", (("fp32", "fp32"), ("bf16", "bf16")), "fp32"),
}


_READOUT = (("speedup", "speedup T1/T2", "x"), ("efficiency", "two-device efficiency", ""),
            ("t_one_ms", "one device T1", "ms"), ("t_two_ms", "two devices T2", "ms"),
            ("comm_ms", "communication H", "ms"), ("break_even_C_ms", "break-even C", "ms"),
            ("min_bandwidth_GBps", "minimum bandwidth", "GB/s"), ("min_eta", "minimum η", ""),
            ("ideal_overlap_ms", "perfect-overlap estimate", "ms"))


def _make_slider(key: str, value: float):

    cls, description, kwargs = _SLIDERS[key]
    # continuous_update=False: with True the browser re-sends every value it displays snapped to
    # the slider's step (a preset's 24 GB/s would come back as 23.99), so typed and preset values
    # would not stay exact. A drag updates on release; arrow keys and typed values at once.
    slider = getattr(w, cls)(value=value, description=description, continuous_update=False,
                             style=LABEL, layout=w.Layout(width=WIDTH), **kwargs)
    slider.add_class("lab-slider")
    slider.add_class(f"lab-slider-{key.replace('_', '-')}")
    return slider


def _make_control(key: str, value):

    description, options, _ = _CONTROLS[key]
    control = w.ToggleButtons(options=[(label.strip(), v) for label, v in options], value=value,
                              description=description, style={**LABEL, "button_width": "60px"},
                              layout=w.Layout(width=WIDTH))
    control.add_class("lab-control")
    control.add_class(f"lab-control-{key.replace('_', '-').lower()}")
    return control


def _readout_labels(N: int) -> tuple:
    """The readout's rows; the split's rows name N when it is not 2."""
    if N == 2:
        return _READOUT
    names = {"speedup": f"speedup T1/T{N}", "efficiency": f"{N}-device efficiency", "t_two_ms": f"{N} devices T{N}"}
    return tuple((key, names.get(key, label), unit) for key, label, unit in _READOUT)


def _set_slider(slider, value: float) -> None:
    """Set a slider, widening its range when a preset lies outside it."""
    if hasattr(slider, "base"):
        exponent = math.log(value, slider.base) if value > 0 else slider.min
        slider.min, slider.max = min(slider.min, math.floor(exponent)), max(slider.max, math.ceil(exponent))
    else:
        slider.min, slider.max = min(slider.min, value), max(slider.max, value)
    slider.value = value


def _number_text(value: float, unit: str) -> str:
    if math.isinf(value):
        return "never"
    return f"{value:.4g} {unit}".strip()


def budget_readout_html(values: dict, budget, verdict: str, preset: Preset | None = None,
                        settings: dict | None = None) -> str:
    """Stable HTML for the readout: `[data-key=speedup]` holds `data-value` (repr, or "inf");
    the inputs sit in `data-<input>` attributes, N and the wire dtype in `data-n`, `data-wire-dtype`."""
    settings = settings or {"N": 2, "wire_dtype": "fp32"}
    pays = "pays" if budget.t_two_ms < budget.t_one_ms else "even" if budget.t_two_ms == budget.t_one_ms else "loses"
    rows = "".join(
        f'<tr><th style="text-align:left">{label}</th>'
        f'<td class="lab-value" data-key="{key}" data-value="{getattr(budget, key)!r}">'
        f"{_number_text(getattr(budget, key), unit)}</td></tr>" for key, label, unit in _readout_labels(settings["N"]))
    notes = "".join(f'<li data-key="{html.escape(k)}">{html.escape(v)}</li>' for k, v in budget.notes.items())
    changed = preset is not None and {k: float(v) for k, v in preset.values.items()} != values
    source = (f'<p class="lab-preset" data-name="{html.escape(preset.name)}" data-changed="{str(changed).lower()}">'
              f'<b>{html.escape(preset.name)}</b>{" (since changed with the sliders)" if changed else ""}: '
              f"{html.escape(preset.source)}</p>" if preset else "")
    inputs = " ".join(f'data-{k.replace("_", "-").lower()}="{v!r}"' for k, v in values.items())
    inputs += f' data-n="{int(settings["N"])}" data-wire-dtype="{html.escape(str(settings["wire_dtype"]))}"'
    model = ("" if settings["N"] == 2 and settings["wire_dtype"] == "fp32" else
             f'<p class="lab-n-note">{int(settings["N"])} devices, a ring all-reduce per exchange: '
             f'H = Q((N-1)l + 2(N-1)/N V/B), {html.escape(str(settings["wire_dtype"]))} on the wire.</p>')
    return (f'<div class="lab-readout" data-verdict="{pays}" {inputs}>{model}'
            f'<p class="lab-verdict"><b>{html.escape(verdict)}</b></p><table>{rows}</table>'
            f'<ul class="lab-notes">{notes}</ul>{source}'
            '<p class="lab-model-note"><i>A model with stated assumptions, not a measurement.</i></p></div>')


def _dashboard_title(N: int) -> str:
    many = "two (T2)" if N == 2 else f"{N} (T{N})"
    return f"one device (T1) against {many} as the divisible compute C grows"


@dataclass(frozen=True)
class BudgetDashboard(Dashboard):
    """The widgets of the budget dashboard (the pattern of `labutils.show.dashboard.Dashboard`).

    `sliders` maps each input name to its slider; `values()` reads them; `controls` holds the
    toggles for N and the wire dtype, read by `settings()`; `preset` is the preset menu; `state()`
    holds the numbers the readout shows (plus "values", "settings", "verdict" and "error"); `png()`
    is the current figure.
    """
    controls: dict
    preset: object
    presets: tuple
    _art: dict

    def settings(self) -> dict:
        """{"N": devices, "wire_dtype": "fp32" or "bf16"} from the toggles."""
        return {"N": int(self.controls["N"].value), "wire_dtype": str(self.controls["wire_dtype"].value)}

    def compute(self, values: dict) -> dict:
        settings = self.settings()
        budget = evaluate(**values, n_devices=settings["N"], wire_dtype=settings["wire_dtype"])
        return {**budget.as_dict(), "settings": settings, "verdict": verdict(budget), "_budget": budget}

    def readout_html(self, values: dict, numbers: dict) -> str:
        return budget_readout_html(values, numbers["_budget"], numbers["verdict"], self._state.get("_preset"),
                                   numbers["settings"])

    def draw(self, values: dict, numbers: dict) -> bytes:
        """Move the artists and return the figure as PNG bytes.

        The still parts (axes, ticks, legend) are drawn once and kept as a background; a move
        restores it and draws only the moving artists, unless the axis limits had to change or
        N did (the legend and title name it).
        """
        settings = numbers["settings"]
        ax = self.figure.axes[0]
        before = (ax.get_xlim(), ax.get_ylim())
        relabel = self._state.get("_drawn_N", 2) != settings["N"]
        if relabel:
            label_budget_curves(self._art, settings["N"], legend_outside=True)
            ax.set_title(_dashboard_title(settings["N"]))
            self._state["_drawn_N"] = settings["N"]
        update_budget_curves(self._art, {**values, "n_devices": settings["N"], "wire_dtype": settings["wire_dtype"]},
                             numbers["_budget"], sticky=True, numbers_in_title=False)
        canvas = self.figure.canvas
        if relabel or self._state.get("_background") is None or before != (ax.get_xlim(), ax.get_ylim()):
            canvas.draw()
            self._state["_background"] = canvas.copy_from_bbox(self.figure.bbox)
        canvas.restore_region(self._state["_background"])
        for artist in self._art.values():
            self.figure.draw_artist(artist)
        width, height = canvas.get_width_height()
        buf = io.BytesIO()
        rgba = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        rgba.convert("RGB").save(buf, format="png", compress_level=1)  # fast, lossless, opaque figure
        return buf.getvalue()

    def load_preset(self, index: int) -> None:
        """Set every slider from presets[index], then refresh once."""
        preset = self.presets[index]
        self._state["_muted"] = True
        try:
            for key, value in preset.values.items():
                _set_slider(self.sliders[key], value)
        finally:
            self._state["_muted"] = False
        self._state["_preset"] = preset
        self.refresh()


def budget_dashboard(presets=None, initial: dict | None = None, dpi: int = 80, N: int = 2,
                     wire_dtype: str = "fp32") -> BudgetDashboard:
    """Build the time-budget dashboard: seven sliders, the N and wire-dtype toggles, a preset menu,
    a readout and one figure.

    `presets` defaults to `budget_presets()`; `initial` (the seven inputs) defaults to the first
    preset; the menu shows the preset whose values equal `initial`, if any. `N` (2, 4 or 8) and
    `wire_dtype` ("fp32" or "bf16") set the toggles. Setting `dash.sliders["bandwidth_GBps"].value = 50`
    or `dash.controls["N"].value = 4` updates readout and figure.
    """
    presets = tuple(presets if presets is not None else budget_presets())
    values = {k: float(v) for k, v in (initial or presets[0].values).items()}
    N, wire_dtype = check_devices(N), wire_dtype_name(wire_dtype)
    if N not in (2, 4, 8) or wire_dtype not in ("fp32", "bf16"):
        raise LabInputError(f"N={N} and wire_dtype={wire_dtype!r}: the dashboard offers N in 2, 4, 8 and fp32 or bf16")
    chosen = next((i for i, p in enumerate(presets) if {k: float(v) for k, v in p.values.items()} == values), None)
    apply_style()
    figure = agg_figure(dpi, left=0.08, right=0.66, bottom=0.13, top=0.9)
    ax = figure.add_subplot()
    art = budget_curves(ax, {**values, "n_devices": N, "wire_dtype": wire_dtype}, legend_outside=True)
    ax.set_title(_dashboard_title(N))
    for artist in art.values():
        artist.set_animated(True)  # drawn over a kept background, see BudgetDashboard.draw
    sliders = {key: _make_slider(key, values[key]) for key in _SLIDERS}
    controls = {"N": _make_control("N", N), "wire_dtype": _make_control("wire_dtype", wire_dtype)}
    menu = w.Dropdown(options=[(p.name, i) for i, p in enumerate(presets)], value=chosen,
                      description="preset", style=LABEL, layout=w.Layout(width=WIDTH))
    menu.add_class("lab-preset-menu")
    box, readout, image = layout([menu, *sliders.values(), *controls.values()], f"{int(9.0 * dpi)}px")
    dash = BudgetDashboard(sliders, readout, image, figure, box,
                           {"_preset": None if chosen is None else presets[chosen], "_drawn_N": N},
                           controls, menu, presets, art)
    menu.observe(lambda change: change["new"] is not None and dash.load_preset(change["new"]), names="value")
    dash.watch([*sliders.values(), *controls.values()])
    return dash
