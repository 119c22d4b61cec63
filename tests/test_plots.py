"""The plots of labutils.show.plots, drawn off screen."""

import matplotlib

from labutils.readers.topology import load_sample
from labutils.show.topology_plots import topology_heatmap

matplotlib.use("Agg")


def test_heatmap_draws_one_cell_per_gpu_pair():
    ax = topology_heatmap(load_sample("eight_gpu_pcie_switches"))
    assert len(ax.texts) == 64 and len(ax.get_xticks()) == 8
    assert len(ax.get_legend().get_texts()) == 4  # PIX, PXB, NODE, SYS
