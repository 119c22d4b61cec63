"""The plots of labutils.show.plots, drawn off screen."""

import matplotlib

from labutils.readers.topology import load_sample
from labutils.show.topology_plots import topology_heatmap

matplotlib.use("Agg")


def test_heatmap_draws_one_cell_per_gpu_pair():
    ax = topology_heatmap(load_sample("eight_gpu_pcie_switches"))
    assert len(ax.texts) == 64 and len(ax.get_xticks()) == 8
    assert len(ax.get_legend().get_texts()) == 4  # PIX, PXB, NODE, SYS


def test_sweep_fit_draws_both_held_out_checks():
    import numpy as np
    import pandas as pd

    from labutils.model.fit import heldout_table
    from labutils.show.plots import sweep_fit

    sizes = np.array([1024 * 2**k for k in range(12)], dtype=float)
    frame = pd.DataFrame({"size_bytes": sizes.astype(int), "time_us": 20 + sizes / 5e3, "world_size": 2})
    inside_fit, inside = heldout_table(frame)
    left, right = sweep_fit(inside, inside_fit, beyond=heldout_table(frame, held="largest")[::-1])
    assert len(left.lines) == 2 and "without the largest" in left.lines[1].get_label()
    assert len(right.patches) == 2 * len(sizes)
    left, right = sweep_fit(inside, inside_fit)
    assert len(left.lines) == 1 and len(right.patches) == len(sizes)
