"""The lab's figures share one look: labelled axes with units, log axes where sizes span decades,
colours that read on light and dark themes. Arithmetic never lives here.

Here: the look (`apply_style`, `new_figure`, `bytes_axis`, `PALETTE`) and the all-reduce figures of
notebooks 02, 04 and 05 (busbw against size, the alpha-beta fit, the latency terms). Each other chapter draws
in its own module: `topology_plots` (01), `ring_draw` (04), `tp_plots` (06, 09), `budget_plots` (08),
`ddp_plots` (10), `timeline_view` (09, 10); `budget_plots` and `ddp_plots` hold their chapter's
dashboard too, on the pattern of `dashboard`.
"""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator

from labutils.core.busbw import format_size

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
    apply_style()
    return plt.subplots(nrows, ncols, **kwargs)


def bytes_axis(ax, axis: str = "x", label: str = "message size (bytes, 1024-based)") -> None:
    """Log2 axis whose ticks read 1K, 64K, 1M, ... ."""
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    target.set_major_locator(LogLocator(base=4))
    target.set_major_formatter(FuncFormatter(lambda v, _: format_size(v)))
    (ax.set_xlabel if axis == "x" else ax.set_ylabel)(label)


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


def sweep_fit(table, fit, ax=None, title: str = "All-reduce time: measured and the \u03b1\u2013\u03b2 model",
              beyond=None):
    """Measured time (dots; held-out sizes hollow) and the fitted line, log-log, plus relative error.

    `table`, `fit` come from `heldout_table(frame)` (every other size held out); `beyond`, when
    given, is `heldout_table(frame, held="largest")`: its line is drawn dashed and the errors of
    its held-out (largest) sizes are a second bar beside the first."""
    if ax is None:
        _, ax = new_figure(1, 2, figsize=(11, 4.2))
    left, right = ax
    held = table["held_out"] if "held_out" in table else np.zeros(len(table), dtype=bool)
    left.plot(table["size_bytes"], table["predicted_us"], color=PALETTE[1],
              label=f"fit on the blue sizes: \u03b1={fit.alpha_us:.3g} \u00b5s, busbw={fit.busbw_GBps:.3g} GB/s")
    left.scatter(table["size_bytes"][~held], table["measured_us"][~held], color=PALETTE[0], s=18, label="fitted sizes")
    left.scatter(table["size_bytes"][held], table["measured_us"][held], facecolors="none", edgecolors=PALETTE[3],
                 s=30, label="held-out sizes")
    width = 0.8
    if beyond is not None:
        far, far_fit = beyond
        left.plot(far["size_bytes"], far["predicted_us"], color=PALETTE[4], ls="--",
                  label=f"fit without the largest sizes: busbw={far_fit.busbw_GBps:.3g} GB/s")
        width = 0.4
        right.bar(np.arange(len(far)) + 0.2, 100 * far["rel_error"].where(far["held_out"], 0), width=width,
                  color=PALETTE[4], label="largest sizes, from the fit without them")
    left.set_yscale("log")
    bytes_axis(left)
    left.set_ylabel("time per all-reduce (\u00b5s)")
    left.set_title(title)
    left.legend()
    shift = -0.2 if beyond is not None else 0.0
    right.bar(np.arange(len(table)) + shift, 100 * table["rel_error"], width=width,
              color=[PALETTE[3] if h else PALETTE[0] for h in held])
    right.set_xticks(range(len(table)))
    right.set_xticklabels([format_size(s) for s in table["size_bytes"]], rotation=90, fontsize=8)
    right.set_xlabel("message size")
    right.set_ylabel("|predicted \u2212 measured| / measured (%)")
    right.set_title("Prediction error (red: sizes the fit did not see)")
    if beyond is not None:
        right.legend()
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
