"""The lab's figures share one look: labelled axes with units, log axes where sizes span decades,
colours that read on light and dark themes. Arithmetic never lives here.
"""

from __future__ import annotations

import matplotlib

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
