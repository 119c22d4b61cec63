"""The lab's figures share one look: labelled axes with units, log axes where sizes span decades,
colours that read on light and dark themes. Arithmetic never lives here.
"""

from __future__ import annotations

import matplotlib

from labutils.budget import evaluate, evaluate_n
from labutils.ddp_model import predicted_efficiency
from labutils.topology import PATHS
from labutils.units import format_size

# Colour-blind-safe palette (Okabe-Ito) that keeps contrast on white and on dark backgrounds.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#999999"]

STYLE = {
    "figure.figsize": (7.5, 4.2),
    "figure.dpi": 100,
    "figure.facecolor": "white",  # an opaque figure stays readable inside a dark JupyterLab theme
    "axes.facecolor": "white",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
    "savefig.bbox": "tight",
}


def apply_style() -> None:
    """Use the lab's figure style for every later plot."""
    matplotlib.rcParams.update(STYLE)


def new_figure(nrows: int = 1, ncols: int = 1, **kwargs):
    """A styled (fig, ax) pair, like plt.subplots."""
    import matplotlib.pyplot as plt

    apply_style()
    return plt.subplots(nrows, ncols, **kwargs)


def bytes_axis(ax, axis: str = "x", label: str = "message size (bytes, 1024-based)") -> None:
    """Log2 axis whose ticks read 1K, 64K, 1M, ... ."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    target.set_major_locator(LogLocator(base=4))
    target.set_major_formatter(FuncFormatter(lambda v, _: format_size(v)))
    (ax.set_xlabel if axis == "x" else ax.set_ylabel)(label)


# --- time budget figures ---

def _nice_limit(needed: float, current: float | None = None) -> float:
    """A round upper axis limit (1, 1.25, 1.5, 2, ... x 10^k) that holds `needed`; keeps `current`
    while it still fits and is not twice too large, so small moves leave the axes (and ticks) alone."""
    import math

    if current is not None and needed <= current <= 2 * needed:
        return current
    k = 10.0 ** math.floor(math.log10(needed))
    return next(m * k for m in (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * k >= needed)


def _split_label(N: int) -> str:
    return "two devices: T2 = S + C/(2η) + H" if N == 2 else f"{N} devices: T{N} = S + C/({N}η) + H{N}"


def budget_curves(ax, params: dict, budget=None, grid_points: int = 60, legend_outside: bool = False) -> dict:
    """Draw T1 and T2 against C on `ax`: break-even marked, the two regions shaded, the current C marked.

    `params` holds the seven inputs of `labutils.budget.evaluate`, and optionally `N` and
    `wire_dtype` (`labutils.budget.evaluate_n`; T_N is then drawn). Returns the artists, which
    `update_budget_curves` moves in place (no new artists, so a redraw never flickers).
    """
    from matplotlib.patches import Rectangle

    art = {
        "t1": ax.plot([], [], color=PALETTE[0], lw=2, label="one device: T1 = S + C")[0],
        "t2": ax.plot([], [], color=PALETTE[1], lw=2, label=_split_label(params.get("N", 2)))[0],
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

    `params` may hold `N` and `wire_dtype` besides the seven inputs (N devices; 2 and fp32 are
    the article's model). With `sticky`, the axis limits change only when the curves outgrow
    them (see _nice_limit); without `numbers_in_title` the title is left alone (text is the
    slowest thing to redraw).
    """
    import math

    import numpy as np

    here = budget if budget is not None else evaluate_n(**params)
    ax, C, S = art["t1"].axes, params["C_ms"], params["S_ms"]
    even = here.break_even_C_ms
    xmax = _nice_limit(max(2.0 * C, 1.6 * even if math.isfinite(even) else 0.0, 1.0),
                       ax.get_xlim()[1] if sticky else None)
    grid = np.linspace(0.0, xmax, grid_points)
    curve = evaluate_n(**{**params, "C_ms": grid})
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
    import numpy as np

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
    import numpy as np

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
    import numpy as np

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


# --- topology figures ---
def topology_heatmap(topo, ax=None, title: str | None = None):
    """GPU-to-GPU link classes of a Topology as a colour-coded matrix, fastest paths darkest,
    each cell labelled with its nvidia-smi code. Returns the axes."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    order = ["SYS", "NODE", "PHB", "PXB", "PIX", "NV#"]  # slowest to fastest
    colours = ["#D55E00", "#E69F00", "#F0E442", "#56B4E9", "#0072B2", "#009E73"]
    gpus = topo.gpus
    step = lambda c: order.index("NV#" if c.startswith("NV") else "SYS" if c == "SOC" else c)  # noqa: E731
    grid = np.full((len(gpus), len(gpus)), np.nan)
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            if i != j:
                grid[i, j] = step(topo.link(a, b))
    if ax is None:
        size = min(9.0, 2.2 + 0.45 * len(gpus))
        _, ax = new_figure(figsize=(size + 2.8, size))
    ax.imshow(np.ma.masked_invalid(grid), cmap=ListedColormap(colours), vmin=-0.5, vmax=len(order) - 0.5)
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            dark = i != j and order[int(grid[i, j])] in ("SYS", "PIX", "NV#")
            ax.text(j, i, topo.link(a, b), ha="center", va="center", color="white" if dark else "black",
                    fontsize=8 if len(gpus) <= 8 else 6)
    ax.set_xticks(range(len(gpus)), gpus, rotation=90 if len(gpus) > 8 else 0)
    ax.set_yticks(range(len(gpus)), gpus)
    ax.grid(False)
    ax.set_xlabel("to GPU")
    ax.set_ylabel("from GPU")
    words = {"NV#": "NVLink (# links)", **{k: v[1] for k, v in PATHS.items()}}
    present = sorted({step(topo.link(a, b)) for a in gpus for b in gpus if a != b}, reverse=True)
    ax.legend(handles=[Patch(color=colours[k], label=f"{order[k]}: {words[order[k]]}") for k in present],
              loc="upper left", bbox_to_anchor=(1.02, 1.0), title="path, fastest first")
    ax.set_title(title or f"Link classes: {topo.source.rsplit('/', 1)[-1]}")
    return ax


def copy_bandwidth_bars(frame, expected=None, ax=None):
    """Measured copy bandwidths (GB/s) as bars, one per row of `frame` (copies.measure_copies);
    `expected` is a list aligned with the rows of (low, high) bands from the link table
    (copies.Band or tuples), or None per row, drawn as a grey band behind the bar."""
    labels = [f"{r.kind} {r.src}->{r.dst}" for r in frame.itertuples()]
    if ax is None:
        _, ax = new_figure(figsize=(max(6.0, 0.6 * len(labels) + 2), 4.2))
    shown = False
    for k, band in enumerate(expected or []):
        if band is not None:
            low, high = band
            ax.fill_between([k - 0.45, k + 0.45], low, high, color="#999999", alpha=0.35, lw=0,
                            label=None if shown else "link table range (top: the wire's rate)")
            shown = True
    ax.bar(range(len(labels)), frame["GBps"], color=PALETTE[0], width=0.6, label="measured")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel("copy bandwidth (GB/s, decimal)")
    ax.set_title("Copy bandwidth against the link table")
    ax.legend()
    return ax


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
    import numpy as np

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
    import numpy as np

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
    import math

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
    import numpy as np

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

# --- all-reduce sweep figures ---
def sweep_busbw(frames: dict, references=(), crossover_bytes: float | None = None, ax=None,
                title: str = "Bus bandwidth against message size"):
    """busbw (GB/s, log) against size (log2) for each labelled sweep frame; `references` are
    (label, GB/s) horizontal lines; `crossover_bytes` splits latency- and bandwidth-bound regions."""
    if ax is None:
        _, ax = new_figure()
    for i, (label, frame) in enumerate(frames.items()):
        rows = frame[frame["busbw_GBps"] > 0].sort_values("size_bytes")
        ax.plot(rows["size_bytes"], rows["busbw_GBps"], marker="o", ms=3, color=PALETTE[i % len(PALETTE)], label=label)
    for j, (label, value) in enumerate(references):
        ax.axhline(value, ls="--", lw=1, color=PALETTE[(j + 3) % len(PALETTE)], label=f"{label}: {value:g} GB/s")
    ax.set_yscale("log")
    bytes_axis(ax)
    if crossover_bytes:
        ax.axvline(crossover_bytes, color="0.4", lw=1, ls=":")
        ax.text(crossover_bytes, 0.02, " bandwidth-bound \u2192", transform=ax.get_xaxis_transform(), fontsize=9)
        ax.text(crossover_bytes, 0.02, "\u2190 latency-bound ", transform=ax.get_xaxis_transform(), fontsize=9,
                ha="right")
    ax.set_ylabel("busbw (GB/s, decimal)")
    ax.set_title(title)
    ax.legend(loc="upper left")
    return ax


def sweep_fit(table, fit, ax=None, title: str = "All-reduce time: measured and the \u03b1\u2013\u03b2 model"):
    """Measured time (dots; held-out sizes hollow) and the fitted line, log-log, plus relative error."""
    import numpy as np

    if ax is None:
        _, ax = new_figure(1, 2, figsize=(11, 4.2))
    left, right = ax
    held = table["held_out"] if "held_out" in table else np.zeros(len(table), dtype=bool)
    left.plot(table["size_bytes"], table["predicted_us"], color=PALETTE[1], label=f"model: \u03b1={fit.alpha_us:.3g} \u00b5s, "
              f"busbw={fit.busbw_GBps:.3g} GB/s")
    left.scatter(table["size_bytes"][~held], table["measured_us"][~held], color=PALETTE[0], s=18, label="fitted sizes")
    left.scatter(table["size_bytes"][held], table["measured_us"][held], facecolors="none", edgecolors=PALETTE[3],
                 s=30, label="held-out sizes")
    left.set_yscale("log")
    bytes_axis(left)
    left.set_ylabel("time per all-reduce (\u00b5s)")
    left.set_title(title)
    left.legend()
    right.bar(range(len(table)), 100 * table["rel_error"], color=[PALETTE[3] if h else PALETTE[0] for h in held])
    right.set_xticks(range(len(table)))
    right.set_xticklabels([format_size(s) for s in table["size_bytes"]], rotation=90, fontsize=8)
    right.set_xlabel("message size")
    right.set_ylabel("|predicted \u2212 measured| / measured (%)")
    right.set_title("Prediction error (red: sizes the fit did not see)")
    return ax


def latency_terms(world_sizes, ring_us, tree_us, ax=None):
    """The latency term of ring and tree all-reduce against N (log2 x axis)."""
    if ax is None:
        _, ax = new_figure()
    ax.plot(world_sizes, ring_us, marker="o", color=PALETTE[0], label="ring: 2(N\u22121)\u00b7\u03b1_step")
    ax.plot(world_sizes, tree_us, marker="s", color=PALETTE[1], label="tree: 2\u00b7log\u2082N\u00b7\u03b1_step")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks N")
    ax.set_ylabel("latency term (\u00b5s)")
    ax.set_title("Small messages: the ring pays per rank, the tree per level")
    ax.legend()
    return ax
