"""What joins the devices, drawn (notebook 01): the `nvidia-smi topo -m` matrix as a heatmap of path
classes, and measured copy bandwidth against the band each wire should carry."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from labutils.readers.topology import PATHS
from labutils.show.plots import PALETTE, new_figure


def topology_heatmap(topo, ax=None, title: str | None = None):
    """GPU-to-GPU link classes of a Topology as a colour-coded matrix, fastest paths darkest,
    each cell labelled with its nvidia-smi code. Returns the axes."""
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
