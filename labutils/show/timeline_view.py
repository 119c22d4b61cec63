"""One recorded step drawn lane by lane (notebooks 09 and 10): the events of
`labutils.measure.timeline` as bars, one row per (rank, lane), coloured by what ran there."""

from __future__ import annotations

import pandas as pd
from matplotlib.patches import Patch

from labutils.measure.timeline import KINDS, merge_intervals
from labutils.show.plots import new_figure

KIND_COLOURS = {"compute": "#0072B2", "communication": "#D55E00", "copy": "#009E73"}


def _lane_order(lane: str) -> tuple:
    return (0 if lane.startswith("CPU main") else 1 if lane.startswith("CPU") else 2, lane)


def draw_timeline(events: pd.DataFrame, ax=None, title: str = "One step, lane by lane"):
    """One row per (rank, lane), bars where compute / communication / copy ran (ms from the step's start)."""
    shown = events[events["kind"].isin(KINDS)]
    lanes = sorted({(int(r), str(lane)) for r, lane in zip(shown["rank"], shown["lane"])},
                   key=lambda rl: (rl[0], _lane_order(rl[1])))
    if ax is None:
        _, ax = new_figure(figsize=(9, 0.55 * len(lanes) + 1.8))
    for y, (rank, lane) in enumerate(lanes):
        mine = shown[(shown["rank"] == rank) & (shown["lane"] == lane)]
        for kind in KINDS:
            part = mine[mine["kind"] == kind]
            spans = merge_intervals(zip(part["start_ms"], part["end_ms"]))
            ax.broken_barh([(s, max(e - s, 1e-4)) for s, e in spans], (y - 0.35, 0.7), color=KIND_COLOURS[kind])
    ax.set_yticks(range(len(lanes)), [f"rank {r} · {lane}" for r, lane in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlabel("time since the step began (ms)")
    ax.legend(handles=[Patch(color=KIND_COLOURS[k], label=k) for k in KINDS], ncol=3, loc="upper center",
              bbox_to_anchor=(0.5, -0.18 - 0.1 / max(1, len(lanes))))
    ax.set_title(title)
    return ax
