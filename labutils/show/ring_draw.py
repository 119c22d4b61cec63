"""The ring all-reduce drawn step by step (notebook 04): one panel per step of a simulated
`labutils.model.ring.RingRun`, each rank's chunks with the ranks' inputs they already hold.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.patches import Rectangle

from labutils.model.ring import RingRun, chunk_view
from labutils.show.plots import PALETTE, new_figure

# --- drawing -------------------------------------------------------------------------------------

def draw_ring_step(ax, run: RingRun, number: int) -> None:
    """Draw the buffers after step `number` (0: the inputs) on `ax`.

    One row of boxes per rank, one box per chunk with its numbers; a chunk that holds the full
    sum is green, one holding some ranks' inputs is shaded by how many; the chunks just received
    are outlined in red and every message of the step is an arrow from the sender's chunk down to
    its right neighbour's (the last rank's message wraps round to rank 0, drawn at the edges).
    """
    n = run.world_size
    step = run.steps[number - 1] if number > 0 else None
    values = step.values if step else run.inputs
    holders = step.contributors if step else np.eye(n, dtype=bool)[:, None, :].repeat(n, axis=1)
    received = {(t.dst, t.chunk) for t in step.transfers} if step else set()
    row_gap, height = 1.0, 0.55  # rank r's boxes span y = -r*row_gap +- height/2
    longest = max(len(" ".join(map(str, chunk_view(values[r], run.bounds, c).tolist())))
                  for r in range(n) for c in range(n))
    fontsize = max(5.0, min(10.0, 44.0 / max(4, longest)))
    arrow = {"arrowstyle": "-|>", "color": PALETTE[3], "lw": 1.4, "mutation_scale": 9}
    for r in range(n):
        y = -r * row_gap
        ax.text(-0.15, y, f"rank {r}", ha="right", va="center", fontsize=8, color="0.25")
        for c in range(n):
            share = holders[r, c].sum() / n
            colour = PALETTE[2] if holders[r, c].all() else (0.92 - 0.5 * share, 0.95 - 0.35 * share, 1.0)
            edge, lw = (PALETTE[3], 2.6) if (r, c) in received else ("0.35", 0.8)
            ax.add_patch(Rectangle((c + 0.04, y - height / 2), 0.92, height, facecolor=colour, edgecolor=edge,
                                   lw=lw, zorder=2))
            text = " ".join(map(str, chunk_view(values[r], run.bounds, c).tolist()))
            ax.text(c + 0.5, y, text, ha="center", va="center", fontsize=fontsize, zorder=3,
                    color="white" if holders[r, c].all() else "black")
    top, bottom = height / 2, -(n - 1) * row_gap - height / 2
    for t in (step.transfers if step else ()):
        x = t.chunk + 0.5
        if t.dst == t.src + 1:
            ax.annotate("", xy=(x, -t.dst * row_gap + height / 2), xytext=(x, -t.src * row_gap - height / 2),
                        arrowprops=arrow, zorder=4)
        else:  # the ring closes: the last rank sends to rank 0
            ax.annotate("", xy=(x, bottom - 0.32), xytext=(x, bottom), arrowprops=arrow, zorder=4)
            ax.text(x, bottom - 0.36, f"to rank {t.dst}", ha="center", va="top", fontsize=7, color=PALETTE[3])
            ax.annotate("", xy=(x, top), xytext=(x, top + 0.32), arrowprops=arrow, zorder=4)
            ax.text(x, top + 0.36, f"from rank {t.src}", ha="center", va="bottom", fontsize=7, color=PALETTE[3])
    for c in range(n):
        ax.text(c + 0.5, bottom - 0.85, f"chunk {c}", ha="center", va="center", fontsize=7, color="0.4")
    ax.set_xlim(-1.1, n + 0.05)
    ax.set_ylim(bottom - 1.0, top + 0.75)
    ax.axis("off")
    if step is None:
        ax.set_title("the inputs", fontsize=10)
    else:
        verb = "adds it" if step.phase == "reduce-scatter" else "keeps it"
        ax.set_title(f"step {step.number}: {step.phase} {step.index}/{n - 1}\n"
                     f"each rank sends one chunk on; the receiver {verb}", fontsize=9)


def draw_ring(run: RingRun, columns: int | None = None):
    """One panel per step of `run` (the inputs first), as one matplotlib figure; returns it."""
    panels = len(run.steps) + 1
    cols = columns or min(4, panels)
    rows = math.ceil(panels / cols)
    n = run.world_size
    fig, axes = new_figure(rows, cols, figsize=(cols * (1.0 + 0.75 * n), rows * (1.3 + 0.55 * n)), squeeze=False)
    for i, ax in enumerate(axes.ravel()):
        if i < panels:
            draw_ring_step(ax, run, i)
        else:
            ax.axis("off")
    fig.suptitle(f"Ring all-reduce on {n} ranks, chunk by chunk (green: the full sum; red outline: "
                 "just received)", fontsize=11)
    fig.tight_layout()
    return fig
