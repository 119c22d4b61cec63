"""Each GPU pair's path classified in plain words (`classify`, `pair_path`), the route its bytes take
(peer-to-peer, or through host memory where peer access is off, NCCL's default beyond PXB), the
bandwidth that path can carry from `data/link_table.csv` (`expected_figure`), and the pair or group
a ring should use (`choose_pair`, `group_bottleneck`). Read through labutils.readers.topology.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pandas as pd

from labutils.core.inputs import LabInputError
from labutils.readers.links import LinkFigure, link_figure, link_figures, nvlink_figure, pcie_figure, range_kind
from labutils.readers.pcie import pcie_band, scale_to_pcie
from labutils.readers.topology_matrix import DEFAULT_PCIE_GEN, MAX_NVLINKS, Topology, device_name

# code -> (speed rank, higher is faster; the short name of the path; the path in plain words)
PATHS = {
    "PIX": (5, "same PCIe switch", "at most one PCIe bridge between them: peer traffic turns round "
            "inside one PCIe switch and never reaches the CPU"),
    "PXB": (4, "across PCIe switches", "several PCIe bridges (a tree of switches) between them, "
            "still without passing through the CPU's host bridge"),
    "PHB": (3, "through the host bridge", "traffic climbs to the CPU's PCIe root complex (host "
            "bridge) and back down to the other GPU"),
    "NODE": (2, "across host bridges, one NUMA node", "traffic crosses from one PCIe host bridge to "
             "another inside the same CPU socket"),
    "SYS": (1, "across NUMA nodes / sockets", "traffic crosses PCIe and the socket-to-socket link "
            "(QPI/UPI/Infinity Fabric): the slowest path inside one machine"),
}



@dataclass(frozen=True)
class PairPath:
    """One GPU pair: its code, path class, plain-language description, expected range (decimal
    GB/s per direction) with the table row it came from, and its route ("NVLink", "peer-to-peer"
    or "through host memory", see `path_route`)."""

    a: str
    b: str
    code: str
    path_class: str
    rank: int
    nvlinks: int
    description: str
    low_GBps: float
    high_GBps: float
    reference: str
    route: str = ""


P2P_BY_DEFAULT = ("PIX", "PXB")  # NCCL's default P2P level is PXB (src/graph/paths.cc)
HOST_MEMORY = "through host memory"


def _code(code) -> str:
    """A link code as a string, SOC read as SYS; LabInputError naming it when it is no string."""
    if not isinstance(code, str) or not code.strip():
        raise LabInputError(f"code={code!r} is not a link code (NV#, PIX, PXB, PHB, NODE or SYS)")
    code = code.strip()
    return "SYS" if code == "SOC" else code


def _nvlinks(code) -> int:
    """The # of an NV# code, or LabInputError naming the code (NV1 to NV{MAX_NVLINKS})."""
    digits = str(code)[2:]
    if not digits.isdigit() or not 1 <= int(digits) <= MAX_NVLINKS:
        raise LabInputError(f"code={code!r} is not an NVLink code NV1 to NV{MAX_NVLINKS}")
    return int(digits)


def path_route(code: str, p2p: bool | None = None) -> str:
    """How the bytes of a GPU pair travel: "NVLink", "peer-to-peer" or "through host memory".

    `p2p` is whether the two GPUs have peer access (torch.cuda.can_device_access_peer on a live
    machine); None means unknown, and then NCCL's default decides: peer-to-peer up to PXB (one or
    several PCIe switches), through host memory beyond (PHB, NODE, SYS). Without peer access,
    every byte is copied GPU -> host memory -> GPU.
    """
    code = _code(code)
    if code.startswith("NV"):
        return "NVLink"
    if p2p is None:
        p2p = code in P2P_BY_DEFAULT
    return "peer-to-peer" if p2p else HOST_MEMORY


def expected_figure(code: str, pcie_gen: int = DEFAULT_PCIE_GEN, p2p: bool | None = None,
                    width: int = 16) -> LinkFigure:
    """The table's range (GB/s per direction) for one link code on PCIe `pcie_gen` x`width`.

    NV#: `nvlink_figure(#)`. PIX, PXB, PHB, NODE: their own rows (the PCIe link's rate) when the
    pair goes peer-to-peer, the "through host memory" row (half to all of a clean link's typical
    figure) when it does not (`path_route`). SYS: low = the source article's measured 22 GB/s on
    PCIe 5.0 x16 (22 of 63, carried to other links by the specification's ratio), high = a clean
    link's typical figure (~50 GB/s on PCIe 5.0 x16). Rows stated for PCIe 5.0 x16 are carried over
    by `pcie.scale_to_pcie`; the figure's name says the route.
    """
    code = _code(code)
    if code.startswith("NV"):
        return nvlink_figure(_nvlinks(code))
    if code not in PATHS:
        raise LabInputError(f"code={code!r} is not a GPU-to-GPU link code (X excluded)")
    way = path_route(code, p2p)
    if code == "SYS":

        row = link_figure("PCIe 5.0 x16 across sockets (SYS)")
        this = pcie_band(pcie_gen, width)
        low = round(this.high_GBps * row.low_GBps / pcie_figure(5).high_GBps, 3)
        return LinkFigure(f"SYS across sockets, {way} (PCIe {pcie_gen}.0 x{width})", "SYS", low, this.low_GBps,
                          range_kind("measured busbw", this.low_kind),
                          f"{row.source}; carried to PCIe {pcie_gen}.0 x{width} by its specification's ratio "
                          f"(22 of 63 GB/s); high end: the low end of {this.name} ({this.low_kind})",
                          "measured busbw")
    if way == HOST_MEMORY:
        host = next(f for f in link_figures("HOST"))
        fig = scale_to_pcie(host, pcie_gen, width)
        return LinkFigure(f"{code} {fig.name}", code, fig.low_GBps, fig.high_GBps, fig.kind, fig.source, fig.low_kind)
    return scale_to_pcie(next(f for f in link_figures(code)), pcie_gen, width)


def path_table(pcie_gen: int = DEFAULT_PCIE_GEN, width: int = 16) -> pd.DataFrame:
    """The legend with its expectations: per code (NV#, PIX, PXB, PHB, NODE, SYS) the path in
    words, the route NCCL takes by default, the range (GB/s per direction on PCIe `pcie_gen` x
    `width`; NV# for a pair of consumer cards bridged by 4 links) and where the figures come from."""
    rows = []
    for code in ("NV4", *PATHS):
        rank, short, words, _ = classify(code)
        fig = expected_figure(code, pcie_gen, None, width)
        rows.append({"code": "NV#" if code.startswith("NV") else code, "path": short, "what the bytes cross": words,
                     "route by default": path_route(code), "low_GBps": fig.low_GBps, "high_GBps": fig.high_GBps,
                     "from": fig.name, "source": fig.source})
    return pd.DataFrame(rows).set_index("code")


def classify(code: str) -> tuple[int, str, str, int]:
    """(speed rank, class name, plain-language description, NVLink count) for one code."""
    code = _code(code)
    if code.startswith("NV"):
        links = _nvlinks(code)
        return (100 + links, f"NVLink x{links}", f"{links} bonded NVLink(s) joining the two GPUs directly "
                f"(or through NVSwitch): traffic never touches PCIe or the CPU", links)
    if code not in PATHS:
        raise LabInputError(f"code={code!r} is not a GPU-to-GPU link code (X excluded)")
    rank, short, words = PATHS[code]
    return rank, short, words, 0


def pair_path(topo: Topology, a: str | int, b: str | int, pcie_gen: int = DEFAULT_PCIE_GEN,
              p2p: bool | None = None, width: int = 16) -> PairPath:
    """The path between GPUs `a` and `b`; `p2p` is their peer access when known (see `path_route`)."""
    a, b = device_name(topo, a), device_name(topo, b)
    code = topo.link(a, b)
    if code == "X":
        raise LabInputError(f"pair=({a}, {b}) names the same device twice")
    rank, short, words, links = classify(code)
    fig = expected_figure(code, pcie_gen, p2p, width)
    way = path_route(code, p2p)
    if way == HOST_MEMORY:
        words += "; without peer-to-peer the bytes are copied through host memory on the way"
    return PairPath(a, b, code, short, rank, links, words, fig.low_GBps, fig.high_GBps, fig.name, way)


def pair_paths(topo: Topology, pcie_gen: int = DEFAULT_PCIE_GEN) -> list[PairPath]:
    """Every GPU pair (a < b), in matrix order."""
    return [pair_path(topo, a, b, pcie_gen) for a, b in itertools.combinations(topo.gpus, 2)]


@dataclass(frozen=True)
class PairChoice:
    """The pair to pick for a 2-GPU job, the slowest pair in the group, and why."""

    best: PairPath
    worst: PairPath
    reason: str


def choose_pair(topo: Topology, among=None, pcie_gen: int = DEFAULT_PCIE_GEN) -> PairChoice:
    """The fastest-joined pair among `among` (GPU indices or names; all GPUs by default).

    Ties go to the lowest indices. A 2-GPU all-reduce runs over exactly this one path, so its
    busbw is bounded by the path's range.
    """
    names = [device_name(topo, g) for g in (among if among is not None else topo.gpus)]
    if len(set(names)) < 2:
        raise LabInputError(f"among={among!r} must name at least two different GPUs")
    paths = [pair_path(topo, a, b, pcie_gen) for a, b in itertools.combinations(names, 2)]
    best = max(paths, key=lambda p: p.rank)
    worst = min(paths, key=lambda p: p.rank)
    reason = (f"{best.a} and {best.b} are joined by {best.code} ({best.path_class}): {best.description}. "
              f"Expect about {best.low_GBps:g}-{best.high_GBps:g} GB/s per direction ({best.reference}).")
    if worst.rank < best.rank:
        reason += (f" Avoid pairs like {worst.a}-{worst.b} ({worst.code}, {worst.path_class}, "
                   f"{worst.low_GBps:g}-{worst.high_GBps:g} GB/s).")
    return PairChoice(best, worst, reason)


def group_bottleneck(topo: Topology, gpus, pcie_gen: int = DEFAULT_PCIE_GEN) -> PairPath:
    """The slowest path between two members of `gpus`. A ring that spans the group must cross
    from one side of such a path to the other, so this path bounds the group's all-reduce busbw
    (NCCL may order the ring to cross it as few times as possible, never zero times)."""
    return choose_pair(topo, gpus, pcie_gen).worst
