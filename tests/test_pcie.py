"""PCIe: what a link carries at any generation and width, and `lspci -vvv` read into devices, their
links, Access Control Services and the tree of bridges above each GPU."""

import pytest

from labutils.core.inputs import LabInputError
from labutils.readers.links import link_figure, pcie_figure
from labutils.readers.pcie import bridges_above, nvidia_gpus, parse_lspci, pcie_band, scale_to_pcie, spec_GBps

# Two GPUs under two root ports: the first link downtrained to gen 3 x8, ACS on above the second.
TWO_ROOTS = """\
$ sudo lspci -vvv
00:01.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge (prog-if 00 [Normal decode])
\tBus: primary=00, secondary=01, subordinate=01, sec-latency=0
\tCapabilities: [58] Express (v2) Root Port (Slot+), MSI 00
\t\tLnkCap:\tPort #0, Speed 16GT/s, Width x16, ASPM L1, Exit Latency L1 <64us
\t\tLnkSta:\tSpeed 16GT/s (ok), Width x16 (ok)
\t\tLnkCap2: Supported Link Speeds: 2.5-16GT/s, Crosslink- Retimer+ 2Retimers+ DRS-
\tCapabilities: [2a0 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+
\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans+

01:00.0 3D controller: NVIDIA Corporation AD102GL [L40S] (rev a1)
\tCapabilities: [78] Express (v2) Legacy Endpoint, MSI 00
\t\tLnkCap:\tPort #0, Speed 16GT/s, Width x16, ASPM not supported
\t\tLnkSta:\tSpeed 8GT/s (downgraded), Width x8 (downgraded)

00:03.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge (prog-if 00 [Normal decode])
\tBus: primary=00, secondary=02, subordinate=02, sec-latency=0
\tCapabilities: [58] Express (v2) Root Port (Slot+), MSI 00
\t\tLnkCap:\tPort #0, Speed 16GT/s, Width x16, ASPM L1, Exit Latency L1 <64us
\t\tLnkSta:\tSpeed 16GT/s (ok), Width x16 (ok)
\tCapabilities: [2a0 v1] Access Control Services
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-

02:00.0 3D controller: NVIDIA Corporation AD102GL [L40S] (rev a1)
\tCapabilities: [78] Express (v2) Legacy Endpoint, MSI 00
\t\tLnkCap:\tPort #0, Speed 16GT/s, Width x16, ASPM not supported
\t\tLnkSta:\tSpeed 16GT/s, Width x16, TrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-
02:00.1 Audio device: NVIDIA Corporation AD102 High Definition Audio Controller (rev a1)
\tCapabilities: [78] Express (v2) Endpoint, MSI 00
"""


def test_pcie_band_follows_generation_and_width():
    assert pcie_band(4, 16).high_GBps == pcie_figure(4).high_GBps == 31.5
    assert pcie_band(4, 8).high_GBps == pytest.approx(31.5 / 2)
    assert pcie_band(3, 16).high_GBps == pytest.approx(pcie_band(4, 16).high_GBps / 2)
    assert spec_GBps(1, 16) == pytest.approx(4.0) and spec_GBps(2, 16) == pytest.approx(8.0)
    assert pcie_band(1, 16).high_GBps == pytest.approx(4.0)
    assert pcie_band(1, 16).low_GBps < 4.0
    assert pcie_band(6, 16).high_GBps > pcie_band(5, 16).high_GBps
    with pytest.raises(LabInputError, match="pcie_gen"):
        pcie_band(7, 16)
    with pytest.raises(LabInputError, match="pcie_width"):
        pcie_band(4, 3)


def test_lspci_is_read_into_devices_links_acs_and_the_tree():
    devices = parse_lspci(TWO_ROOTS)
    gpus = nvidia_gpus(devices)
    assert [g.address for g in gpus] == ["0000:01:00.0", "0000:02:00.0"]
    assert (gpus[0].gen, gpus[0].link_width, gpus[0].cap_gen, gpus[0].link_cap_width) == (3, 8, 4, 16)
    assert (gpus[1].gen, gpus[1].link_width) == (4, 16), "the older LnkSta layout without (ok) is read too"
    first, second = bridges_above(devices, gpus[0]), bridges_above(devices, gpus[1])
    assert [b.address for b in first] == ["0000:00:01.1"] and [b.address for b in second] == ["0000:00:03.1"]
    assert first[0].acs_on == () and first[0].port_type == "Root Port", "DirectTrans+ alone is not ACS blocking"
    assert second[0].acs_on == ("SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd")


def test_rows_stated_for_pcie5_scale_to_any_generation_and_width():
    host = link_figure("through host memory, no peer access (PCIe 5.0 x16)")
    assert scale_to_pcie(host, 5, 16) == host
    x8 = scale_to_pcie(host, 5, 8)
    assert (x8.low_GBps, x8.high_GBps) == (12.5, 25) and "PCIe 5.0 x8" in x8.name
    six = scale_to_pcie(host, 6, 16)
    assert six.high_GBps == pytest.approx(50 * pcie_band(6).high_GBps / 63, abs=1e-3)
