"""The time budget's figures (notebook 06, and the dashboard in `labutils.show.budget_dashboard`): the two
split times against compute, serial dilution, the overlap bound and the thresholds. The look is
`labutils.show.plots`'; the arithmetic is `labutils.model.budget`'s.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.patches import Rectangle

from labutils.model.budget import evaluate
from labutils.show.plots import PALETTE, new_figure

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


def plot_overlap_bound(params: dict, C_max_ms: float | None = None):
    """T1, T2 and the perfect-overlap lower bound S + max(C/(2η), H) against C."""
    C = np.linspace(0.0, C_max_ms or 2.0 * params["C_ms"], 200)
    b = evaluate(**{**params, "C_ms": C})
    fig, ax = new_figure()
    ax.plot(C, b.t_one_ms, lw=2, label="one device, T1")
    ax.plot(C, b.t_two_ms, lw=2, label="two devices, no overlap, T2")
    ax.plot(C, b.overlap_bound_ms, lw=2, ls="--", label="perfect overlap (lower bound)")
    ax.fill_between(C, b.overlap_bound_ms, b.t_two_ms, color=PALETTE[2], alpha=0.15,
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
