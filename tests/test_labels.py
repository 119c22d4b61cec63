"""Every label true: what each end of a link_table row is, what a preset's figure is, and the
notebooks' prose free of claims the lab found false."""

import json
import re
from pathlib import Path

import pytest

from labutils.readers.links import LOW_KINDS, link_figure, link_figures, load_link_table, nvlink_figure
from labutils.readers.pcie import pcie_band
from labutils.readers.topology import expected_figure
from labutils.show.budget_plots import budget_presets

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SPEC_BODIES = ("PCI-SIG", "NVIDIA", "IEEE", "InfiniBand")


def test_a_specification_row_is_specification_at_both_ends():
    for fig in link_figures():
        assert fig.low_kind in LOW_KINDS, fig.name
        if fig.kind == "specification":
            assert fig.low_kind == "specification", fig.name
            assert any(body in fig.source for body in SPEC_BODIES), f"{fig.name}: no specification named"
            assert not re.search(r"busbw|reported|typical|estimate", fig.source), \
                f"{fig.name} is labelled a specification but its source speaks of another figure"


def test_rows_whose_low_end_is_a_bus_bandwidth_say_so():
    for fig in link_figures():
        if "busbw" in fig.source and fig.low_GBps < fig.high_GBps and fig.kind != "derived to specification":
            assert fig.low_kind == "reported busbw" and fig.kind == "reported busbw to specification", fig.name
    for name in ("NVLink 2 (V100 SXM)", "NVLink 3 (A100 SXM)", "NVLink 4 (H100 SXM)"):
        assert link_figure(name).low_kind == "reported busbw"
    for name in ("PCIe 5.0 x16 across sockets (SYS)", "gloo through host memory"):
        fig = link_figure(name)
        assert fig.kind == "measured busbw" and "source article" in fig.source
    assert link_figure("PCIe 5.0 x16").low_kind == "quoted clean link"


def test_mixed_rows_name_both_ends():
    table = load_link_table()
    mixed = table[table.kind != table.low_kind]
    assert len(mixed) > 0
    for row in mixed.itertuples():
        assert row.kind == f"{row.low_kind} to specification"
        assert re.search(r"low end", row.source, re.I) and re.search(r"high end|specification", row.source), row.name


def test_figures_built_from_rows_keep_their_labels():
    assert pcie_band(4, 8).low_kind == "estimate" and pcie_band(4, 8).kind == "estimate to specification"
    assert pcie_band(6).kind == "estimate to specification", "gen 6's low end is the gen-4 row's share"
    assert nvlink_figure(8).kind == "specification"  # 8 x the per-link rows' specification ends
    assert nvlink_figure(18).low_kind == "reported busbw"
    sys_fig = expected_figure("SYS", 5)
    assert sys_fig.low_kind == "measured busbw" and sys_fig.kind == "measured busbw to quoted clean link"
    assert expected_figure("PIX", 4).low_kind == "quoted clean link"


def test_presets_say_what_their_bandwidth_is():
    presets = budget_presets()
    assert "hypothetical" in presets[0].name
    by_name = {p.name: p for p in presets}
    for fig in link_figures():
        name = f"{fig.name}: {fig.low_GBps:g} GB/s ({fig.low_kind})"
        assert name in by_name, name
        preset = by_name[name]
        assert preset.values["bandwidth_GBps"] == pytest.approx(fig.low_GBps)
        assert preset.source.startswith(f"{fig.low_kind}: the low end"), preset.source
        if fig.low_kind != "specification":
            assert not preset.source.startswith("specification"), preset.name


# phrases the lab once printed and found false: NCCL does not always move GPU memory directly (across
# sockets and without P2P it stages through host memory); its collectives are kernels on the SMs, not
# copy engines; an all-reduce's cost depends on its size (alpha-beta), on every route.
FALSE_PHRASES = ("whatever the size", "moves gpu memory directly", "copy engines and links do the moving",
                 "~22 gb/s even across sockets", "gloo's ~1 gb/s", "shorter than ℓ can never gain",
                 "runs on its own stream and hides")


def _markdown(path):
    cells = json.loads(path.read_text())["cells"]
    return [("".join(c["source"]), i) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name[:2])
def test_notebook_markdown_avoids_known_false_claims(path):
    for text, index in _markdown(path):
        flat = " ".join(text.lower().split())
        for phrase in FALSE_PHRASES:
            assert phrase not in flat, f"{path.name} cell {index}: {phrase!r}"
