"""What joins the devices: `nvidia-smi topo -m` read into a frozen Topology, each GPU pair's path
classified in plain words, the route its bytes take (peer-to-peer, or through host memory where
peer access is off, NCCL's default beyond PXB), and the bandwidth that path can carry from
`data/link_table.csv`. A GPU's own PCIe link (generation, width) comes from NVML (`host_link`).

Link codes of `nvidia-smi topo -m`, fastest first:
    NV#  a bonded set of # NVLinks (directly or through NVSwitch)
    PIX  at most one PCIe bridge (the same PCIe switch)
    PXB  several PCIe bridges, not through the CPU's host bridge
    PHB  through a PCIe host bridge (the CPU's root complex)
    NODE between PCIe host bridges within one NUMA node
    SYS  across NUMA nodes: PCIe plus the socket-to-socket link (QPI/UPI); older drivers say SOC
A ring all-reduce moves every byte over every link of the ring, so its busbw is bounded by the
slowest path in the ring: pick GPUs whose paths are all fast.

The parser and samples are labutils.readers.topology_matrix, the paths and expectations
labutils.readers.topology_paths; this module reads the live machine (nvidia-smi, NVML), writes the reports,
runs the `topo` command, and re-exports both (notebooks and the doctor import from here).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labutils.core.commands import tool_output
from labutils.readers.pcie import GT_PER_LANE, WIDTHS
from labutils.readers.topology_matrix import (
    ATTRIBUTES,
    DEFAULT_PCIE_GEN,
    MAX_NVLINKS,
    SAMPLES_DIR,
    Topology,
    TopologyParseError,
    device_name,
    list_samples,
    load_sample,
    parse_topology,
    read_topology_file,
    sample_facts,
    sample_pcie_gen,
    strip_ansi,
)
from labutils.readers.topology_paths import (
    HOST_MEMORY,
    P2P_BY_DEFAULT,
    PATHS,
    PairChoice,
    PairPath,
    choose_pair,
    classify,
    expected_figure,
    group_bottleneck,
    pair_path,
    pair_paths,
    path_route,
    path_table,
)

# ---- the live machine ----------------------------------------------------------------------

def run_nvidia_smi(timeout_s: float = 15.0) -> tuple[str | None, str]:
    """(`nvidia-smi topo -m` output, "") or (None, why not), through labutils.core.commands.tool_output."""
    return tool_output(["nvidia-smi", "topo", "-m"], "nvidia-smi is not installed on this machine (no NVIDIA driver)",
                       timeout_s, "nvidia-smi topo -m")


def live_topology(timeout_s: float = 15.0) -> tuple[Topology | None, str]:
    """This machine's topology, or (None, why not)."""
    text, why = run_nvidia_smi(timeout_s)
    return (None, why) if text is None else (parse_topology(text, source="nvidia-smi topo -m"), "")


# ---- NVML facts (GPU machines) ------------------------------------------------------------

@dataclass(frozen=True)
class GpuFacts:
    """What NVML says about one GPU: PCIe generation and width (current and max) and how many
    NVLinks are active."""

    index: int
    name: str
    pcie_gen: int | None
    pcie_gen_max: int | None
    pcie_width: int | None
    pcie_width_max: int | None
    nvlinks_active: int


def nvml_facts() -> tuple[list[GpuFacts], str]:
    """([GpuFacts per GPU], "") or ([], why not). Needs nvidia-ml-py and an NVIDIA driver."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"NVML is not available: {exc}"
    try:
        return [_facts(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())], ""
    finally:
        pynvml.nvmlShutdown()


def _facts(pynvml, i: int) -> GpuFacts:
    h = pynvml.nvmlDeviceGetHandleByIndex(i)

    def ask(fn, *args):
        try:
            return int(fn(h, *args))
        except pynvml.NVMLError:
            return None

    active = 0
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        active += ask(pynvml.nvmlDeviceGetNvLinkState, link) == 1
    name = pynvml.nvmlDeviceGetName(h)
    return GpuFacts(i, name.decode() if isinstance(name, bytes) else str(name),
                    ask(pynvml.nvmlDeviceGetCurrPcieLinkGeneration), ask(pynvml.nvmlDeviceGetMaxPcieLinkGeneration),
                    ask(pynvml.nvmlDeviceGetCurrPcieLinkWidth), ask(pynvml.nvmlDeviceGetMaxPcieLinkWidth), active)


def pcie_gen_of(facts: list[GpuFacts]) -> int:
    """The PCIe generation to assume: the lowest max generation among the GPUs, within 3..5."""
    gens = [f.pcie_gen_max for f in facts if f.pcie_gen_max]
    return min(5, max(3, min(gens))) if gens else DEFAULT_PCIE_GEN


@dataclass(frozen=True)
class HostLink:
    """The PCIe link of one GPU as the expectations use it: generation and width (the link's
    maximum for this GPU in this slot, which it trains up to under load), what NVML read right
    now, and a note when the two differ or a figure had to be assumed."""

    gpu: int
    gen: int
    width: int
    current_gen: int | None
    current_width: int | None
    note: str = ""

    @property
    def label(self) -> str:
        return f"PCIe {self.gen}.0 x{self.width}"


def host_link(facts: GpuFacts | None, gpu: int = 0, default_gen: int = DEFAULT_PCIE_GEN) -> HostLink:
    """GPU `gpu`'s PCIe link from NVML's facts (a pure function: the facts are passed in).

    Generation and width are NVML's maxima for this GPU in this slot (nvmlDeviceGetMaxPcieLink*:
    the lower of what the GPU and the slot support), falling back to the current values, then to
    PCIe `default_gen`.0 x16 when NVML said nothing; any generation 1-6 (`pcie.pcie_band`). The
    current values are shown beside them: an idle link trains down (e.g. to gen 1) to save power
    and back up under load.
    """

    if facts is None:
        return HostLink(gpu, default_gen, 16, None, None,
                        f"NVML gave no PCIe facts: PCIe {default_gen}.0 x16 assumed")
    notes = []
    gen = facts.pcie_gen_max or facts.pcie_gen
    width = facts.pcie_width_max or facts.pcie_width
    if gen not in GT_PER_LANE:
        told = "no PCIe generation" if gen is None else f"PCIe gen {gen}, which is not one of 1-6"
        notes.append(f"NVML gave {told}: gen {default_gen} assumed")
        gen = default_gen
    if width is None or width < 1:
        width = 16
        notes.append("NVML gave no link width: x16 assumed")
    elif width not in WIDTHS:
        width = max(w for w in WIDTHS if w <= width)
    cur_gen, cur_width = facts.pcie_gen, facts.pcie_width
    if (cur_gen and cur_gen < gen) or (cur_width and cur_width < width):
        notes.append(f"NVML reads gen {cur_gen} x{cur_width} right now: an idle link trains down to save power "
                     f"and back up to gen {gen} x{width} under load")
    return HostLink(gpu, int(gen), int(width), cur_gen, cur_width, "; ".join(notes))


# ---- reports: JSON and text ---------------------------------------------------------------

def summary(topo: Topology, pcie_gen: int = DEFAULT_PCIE_GEN) -> dict:
    """Everything `topo --json` prints: gpus, links, affinities, NICs, pairs and the pick."""
    gpus = topo.gpus
    out = {
        "source": topo.source,
        "gpus": list(gpus),
        "links": topo.gpu_links(),
        "cpu_affinity": dict(zip(gpus, topo.cpu_affinity)),
        "numa_affinity": dict(zip(gpus, topo.numa_affinity)),
        "gpu_numa_id": dict(zip(gpus, topo.gpu_numa_id)),
        "nics": {n: topo.nic_name(n) for n in topo.nics},
        "nic_links": {g: {n: topo.link(g, n) for n in topo.nics} for g in gpus},
        "pcie_gen_assumed": pcie_gen,
        "pairs": [
            {"a": p.a, "b": p.b, "code": p.code, "class": p.path_class, "description": p.description,
             "route": p.route, "expected_low_GBps": p.low_GBps, "expected_high_GBps": p.high_GBps,
             "reference": p.reference}
            for p in pair_paths(topo, pcie_gen)
        ],
    }
    if len(gpus) >= 2:
        pick = choose_pair(topo, pcie_gen=pcie_gen)
        out["best_pair"] = {"gpus": [pick.best.a, pick.best.b], "code": pick.best.code, "reason": pick.reason}
    return out


def format_matrix(topo: Topology, nics: bool = True) -> str:
    """The matrix as aligned text, NIC columns named by the legend."""
    cols = list(topo.gpus) + (list(topo.nics) if nics else [])
    width = max(6, *(len(topo.nic_name(c)) + 1 for c in cols))
    head = " " * width + "".join(topo.nic_name(c).ljust(width) for c in cols)
    lines = [head.rstrip()]
    for r in cols:
        lines.append((topo.nic_name(r).ljust(width) + "".join(topo.link(r, c).ljust(width) for c in cols)).rstrip())
    return "\n".join(lines)


def describe(topo: Topology, pcie_gen: int = DEFAULT_PCIE_GEN) -> str:
    """A plain-text report: matrix, legend of the codes present, one line per pair, the pick."""
    lines = [f"Topology from {topo.source}: {len(topo.gpus)} GPU(s), {len(topo.nics)} NIC(s)", "",
             format_matrix(topo), ""]
    for g, cpu, numa in zip(topo.gpus, topo.cpu_affinity, topo.numa_affinity):
        lines.append(f"{g}: CPU affinity {cpu or 'n/a'}, NUMA node {numa or 'n/a'}")
    lines += ["", f"Each pair (expected GB/s per direction, assuming PCIe {pcie_gen}.0 x16 where PCIe is used, and "
                  "NCCL's default: peer-to-peer up to PXB, through host memory beyond):"]
    for p in pair_paths(topo, pcie_gen):
        lines.append(f"  {p.a}-{p.b}  {p.code:5} {p.path_class:36} "
                     f"{p.low_GBps:>7g} - {p.high_GBps:<7g} ({p.reference})")
    if len(topo.gpus) >= 2:
        lines += ["", "For a 2-GPU job: " + choose_pair(topo, pcie_gen=pcie_gen).reason]
    return "\n".join(lines)


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("topo", help="read nvidia-smi topo -m (or a saved file) and classify each GPU pair")
    p.add_argument("--file", help="a saved `nvidia-smi topo -m` output, or a sample name from data/topologies/")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--pcie-gen", type=int, choices=(3, 4, 5), default=None,
                   help="PCIe generation to assume (default: from NVML, a sample's facts, or 4)")
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    import json

    if args.file is not None:
        topo = read_topology_file(args.file)
        gen = args.pcie_gen or sample_pcie_gen(Path(args.file).stem)
    else:
        topo, why = live_topology()
        if topo is None:
            print(f"No live topology: {why}.")
            print(f"Nothing is wrong with this machine; study a sample instead, e.g. "
                  "`python -m labutils topo --file two_gpu_sys`. "
                  f"Samples in {SAMPLES_DIR}: {', '.join(list_samples())}")
            return 0
        gen = args.pcie_gen or pcie_gen_of(nvml_facts()[0])
    print(json.dumps(summary(topo, gen), indent=2) if args.json else describe(topo, gen))
    return 0


# What `from labutils.readers.topology import ...` offers: this module's own names and the two it re-exports.
__all__ = [
    "ATTRIBUTES",
    "DEFAULT_PCIE_GEN",
    "GpuFacts",
    "HOST_MEMORY",
    "HostLink",
    "MAX_NVLINKS",
    "P2P_BY_DEFAULT",
    "PATHS",
    "PairChoice",
    "PairPath",
    "SAMPLES_DIR",
    "Topology",
    "TopologyParseError",
    "add_cli",
    "choose_pair",
    "classify",
    "describe",
    "device_name",
    "expected_figure",
    "format_matrix",
    "group_bottleneck",
    "host_link",
    "list_samples",
    "live_topology",
    "load_sample",
    "nvml_facts",
    "pair_path",
    "pair_paths",
    "parse_topology",
    "path_route",
    "path_table",
    "pcie_gen_of",
    "read_topology_file",
    "run_nvidia_smi",
    "sample_facts",
    "sample_pcie_gen",
    "strip_ansi",
    "summary",
]
