"""The reference link table: its rows, what each end of a range is, and the NVLink and PCIe helpers."""

import pytest

from labutils.core.inputs import LabInputError
from labutils.readers.links import LOW_KINDS, link_figure, load_link_table, nvlink_figure, pcie_figure


def test_link_table_rows_and_helpers():
    table = load_link_table()
    assert {"name", "path_class", "low_GBps", "high_GBps", "kind", "low_kind", "source"} <= set(table.columns)
    assert set(table.low_kind) <= set(LOW_KINDS)
    assert all(kind in (low, f"{low} to specification") for kind, low in zip(table.kind, table.low_kind))
    assert table.source.str.len().min() > 10, "every row says where its figure comes from"
    assert (table.low_GBps <= table.high_GBps).all()
    for name in ("PCIe 3.0 x16", "PCIe 4.0 x16", "PCIe 5.0 x16", "NVLink 3 (A100 SXM)", "NVLink 4 (H100 SXM)",
                 "NVLink bridge (pair)", "InfiniBand EDR", "InfiniBand HDR", "InfiniBand NDR", "Ethernet 100 GbE"):
        assert link_figure(name).high_GBps > 0
    assert nvlink_figure(4).name == "NVLink bridge (pair)"
    scaled = nvlink_figure(8)
    assert scaled.low_GBps == pytest.approx(8 * 14.0625) and scaled.high_GBps == pytest.approx(8 * 25)
    with pytest.raises(LabInputError):
        pcie_figure(6)
