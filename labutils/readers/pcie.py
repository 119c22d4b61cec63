"""PCIe links as `lspci -vvv` shows them, and what a link carries at any generation and width.

Reading `lspci -vvv` (`parse_lspci`) gives one PciDevice per function: its address, class and
name, the PCIe port type, the link's capability (`LnkCap`) and status (`LnkSta`: the speed and
width it trained to), the bridge's bus range (`Bus: primary=.., secondary=.., subordinate=..`,
from which the tree of bridges above each GPU follows) and Access Control Services (`ACSCtl:`).
Without root, lspci prints `Capabilities: <access denied>`: the device is listed but its link and
ACS are unknown (`access_denied`).

The band of a link (decimal GB/s per direction), `pcie_band(gen, width)`:

    spec = GT/s per lane * width * encoding / 8
    GT/s: gen1 2.5, gen2 5, gen3 8, gen4 16, gen5 32, gen6 64
    encoding: 8b/10b for gen 1-2, 128b/130b for gen 3-5, FLIT (242/256) for gen 6

x16 at gen 3, 4 and 5 is the link table's row as it is (`links.pcie_figure`); other generations
take high = spec and low = spec * (the gen-4 row's low / high), the share real transfers reach.
Any width scales the x16 figures by width / 16.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labutils.core.inputs import LabInputError, check_choice
from labutils.readers.links import LinkFigure, pcie_figure, range_kind
from labutils.readers.sources import read_text

GT_PER_LANE = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}
WIDTHS = (1, 2, 4, 8, 12, 16, 32)
TABLE_GENS = (3, 4, 5)
# ACS controls that keep peer-to-peer traffic from turning round below the root complex. DirectTrans+
# is not one of them: it *allows* translated requests to go straight to the peer.
ACS_BLOCKING = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl")
GPU_CLASSES = ("VGA compatible controller", "3D controller", "Display controller")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE = re.compile(r"^(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})"
                     r"\.(?P<fn>[0-7])\s+(?P<cls>[^:]+?):\s*(?P<name>.*)$")
_BUS = re.compile(r"Bus:\s*primary=([0-9a-fA-F]+),\s*secondary=([0-9a-fA-F]+),\s*subordinate=([0-9a-fA-F]+)")
_PORT = re.compile(r"Express \(v\d\) (Root Port|Upstream Port|Downstream Port|Legacy Endpoint|Endpoint|"
                   r"Root Complex Integrated Endpoint|PCI-Express to PCI/PCI-X Bridge)")
_SPEED = re.compile(r"Speed\s+([\d.]+)GT/s")
_WIDTH = re.compile(r"Width\s+x(\d+)")
_ACS = re.compile(r"\b([A-Za-z]+)([+-])")


def spec_GBps(gen: int, width: int = 16) -> float:
    """Per-direction specification: GT/s per lane * width * encoding / 8 (decimal GB/s)."""
    gen = check_choice("pcie_gen", gen, tuple(GT_PER_LANE))
    width = check_choice("pcie_width", width, WIDTHS)
    return GT_PER_LANE[gen] * width * ENCODING[gen] / 8


def pcie_band(gen: int, width: int = 16) -> LinkFigure:
    """What a PCIe link of generation `gen` and `width` lanes carries per direction (see the module)."""
    gen = int(check_choice("pcie_gen", gen, tuple(GT_PER_LANE)))  # 4.0 is gen 4: named "PCIe 4.0", not "4.0.0"
    width = int(check_choice("pcie_width", width, WIDTHS))
    scale = width / 16
    if gen in TABLE_GENS:
        row = pcie_figure(gen)
        low, high, source, kind, low_kind = row.low_GBps, row.high_GBps, row.source, row.kind, row.low_kind
    else:
        gen4 = pcie_figure(4)
        high = spec_GBps(gen, 16)
        low = high * gen4.low_GBps / gen4.high_GBps
        source = (f"PCIe {gen}.0: {GT_PER_LANE[gen]:g} GT/s per lane, encoding {ENCODING[gen]:.3f} (high end, "
                  f"specification); low end at the gen-4 row's share of its specification")
        low_kind = gen4.low_kind
        kind = range_kind(low_kind, "specification")
    if width != 16:
        source += f"; scaled by x{width} / x16"
    return LinkFigure(f"PCIe {gen}.0 x{width}", "PCIe", round(low * scale, 3), round(high * scale, 3),
                      kind, source, low_kind)


def gen_of_speed(speed_GTps: float | None) -> int | None:
    """PCIe generation of a lane rate (2.5 -> 1, ..., 32 -> 5); None when unknown."""
    for gen, rate in GT_PER_LANE.items():
        if speed_GTps is not None and abs(speed_GTps - rate) < 1e-6:
            return gen
    return None


@dataclass(frozen=True)
class PciDevice:
    """One function of `lspci -vvv`. `address` is "dddd:bb:dd.f"; link fields are None when
    lspci did not show them; `acs_ctl` maps each ACSCtl flag to on/off (empty: no ACS capability
    shown); `secondary_bus`/`subordinate_bus` are a bridge's bus range."""

    address: str
    domain: int
    bus: int
    device: int
    function: int
    class_name: str
    name: str
    port_type: str | None = None
    link_speed_GTps: float | None = None
    link_width: int | None = None
    link_cap_speed_GTps: float | None = None
    link_cap_width: int | None = None
    acs_ctl: tuple[tuple[str, bool], ...] = ()
    secondary_bus: int | None = None
    subordinate_bus: int | None = None
    access_denied: bool = False

    @property
    def is_bridge(self) -> bool:
        return self.secondary_bus is not None or self.class_name == "PCI bridge"

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.class_name in GPU_CLASSES and "nvidia" in self.name.lower()

    @property
    def gen(self) -> int | None:
        return gen_of_speed(self.link_speed_GTps)

    @property
    def cap_gen(self) -> int | None:
        return gen_of_speed(self.link_cap_speed_GTps)

    @property
    def acs_on(self) -> tuple[str, ...]:
        """The ACSCtl flags that are on and keep peer traffic from turning round below the CPU."""
        return tuple(flag for flag, on in self.acs_ctl if on and flag in ACS_BLOCKING)

    def below(self, other: "PciDevice") -> bool:
        """True when `other` is a bridge whose bus range holds this device's bus."""
        return (other.secondary_bus is not None and other.domain == self.domain and other is not self
                and other.secondary_bus <= self.bus <= other.subordinate_bus)

    def link_text(self) -> str:
        if self.link_speed_GTps is None and self.link_width is None:
            return "link unknown"
        gen = self.gen
        return f"PCIe {gen}.0 x{self.link_width}" if gen else f"{self.link_speed_GTps:g} GT/s x{self.link_width}"


def normalize_address(text: str) -> tuple[int, int, int, int]:
    """(domain, bus, device, function) of "0000:01:00.0", "00000000:01:00.0" or "01:00.0"."""
    match = re.fullmatch(r"\s*(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\s*", str(text))
    if not match:
        raise LabInputError(f"pci_bus_id={text!r} is not a PCI address such as 0000:01:00.0")
    domain, bus, dev, fn = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(dev, 16), int(fn)


def _finish(head: re.Match, body: list[str]) -> PciDevice:
    domain, bus, dev, fn = (int(head.group("domain") or "0", 16), int(head.group("bus"), 16),
                            int(head.group("dev"), 16), int(head.group("fn")))
    fields: dict = {}
    for line in body:
        text = line.strip()
        if text.startswith("Bus:") and (m := _BUS.search(text)):
            fields["secondary_bus"], fields["subordinate_bus"] = int(m.group(2), 16), int(m.group(3), 16)
        elif text.startswith("Capabilities:") and "<access denied>" in text:
            fields["access_denied"] = True
        elif text.startswith("Capabilities:") and (m := _PORT.search(text)):
            fields["port_type"] = m.group(1)
        elif text.startswith(("LnkCap:", "LnkSta:")):
            speed, width = _SPEED.search(text), _WIDTH.search(text)
            key = "link_cap" if text.startswith("LnkCap:") else "link"
            fields[f"{key}_speed_GTps"] = float(speed.group(1)) if speed else None
            fields[f"{key}_width"] = int(width.group(1)) if width else None
        elif text.startswith("ACSCtl:"):
            fields["acs_ctl"] = tuple((flag, sign == "+") for flag, sign in _ACS.findall(text[len("ACSCtl:"):]))
    return PciDevice(f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}", domain, bus, dev, fn, head.group("cls").strip(),
                     head.group("name").strip(), **fields)


def parse_lspci(text: str, source: str = "text") -> tuple[PciDevice, ...]:
    """Every device of `lspci -vvv` output (`-D` domains or not, with or without root). Raises
    LabInputError naming `source` when no device line is found."""
    devices, head, body = [], None, []
    for raw in _ANSI.sub("", str(text)).replace("\r", "").splitlines():
        match = _DEVICE.match(raw) if raw[:1] not in (" ", "\t") else None
        if match:
            if head:
                devices.append(_finish(head, body))
            head, body = match, []
        elif head and raw[:1] in (" ", "\t"):
            body.append(raw)
    if head:
        devices.append(_finish(head, body))
    if not devices:
        raise LabInputError(f"lspci={source!r} holds no device line such as '01:00.0 VGA compatible controller: "
                            "NVIDIA Corporation ...' (is it `lspci -vvv` output?)")
    return tuple(devices)


def read_lspci_file(path) -> tuple[PciDevice, ...]:
    """Every device of a saved `lspci -vvv` output (see parse_lspci)."""
    return parse_lspci(read_text(path, "lspci", "; give a saved `lspci -vvv` output"), source=str(path))


def nvidia_gpus(devices) -> list[PciDevice]:
    """NVIDIA display functions (VGA / 3D / Display controller) in PCI address order, which is
    the order nvidia-smi numbers GPUs in."""
    return sorted((d for d in devices if d.is_nvidia_gpu), key=lambda d: (d.domain, d.bus, d.device, d.function))


def bridges_above(devices, device: PciDevice) -> list[PciDevice]:
    """The bridges whose bus range holds `device`, from the root port down to the nearest one."""
    found = [b for b in devices if device.below(b)]
    return sorted(found, key=lambda b: (b.subordinate_bus - b.secondary_bus, -b.secondary_bus), reverse=True)


def scale_to_pcie(fig: LinkFigure, gen: int, width: int = 16) -> LinkFigure:
    """A row stated for PCIe 5.0 x16 carried over to PCIe `gen` x`width`: its low figure scales as
    the PCIe bands' low (typical) figures do, its high as their high (specification) figures
    (`pcie_band`, any generation 1-6 and width)."""
    if (gen, width) == (5, 16):
        return fig
    five, this = pcie_band(5, 16), pcie_band(gen, width)
    name = fig.name.replace("PCIe 5.0 x16", f"PCIe {gen}.0 x{width}")
    return LinkFigure(name, fig.path_class, round(fig.low_GBps * this.low_GBps / five.low_GBps, 3),
                      round(fig.high_GBps * this.high_GBps / five.high_GBps, 3), fig.kind,
                      f"{fig.source}; scaled from PCIe 5.0 x16 to PCIe {gen}.0 x{width} as the PCIe bands scale",
                      fig.low_kind)
