"""What NVML (the NVIDIA driver's management library, `pynvml` from nvidia-ml-py) says about each
GPU, read without a CUDA context: name, PCIe link, active NVLinks, free memory, PCI bus id and
NUMA node (`nvml_facts`). The topology readers, the doctor and the launcher read GPUs here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuFacts:
    """What NVML says about one GPU (NVML's index, PCI bus order): PCIe generation and width
    (current and max), how many NVLinks are active, its free memory in bytes, its PCI bus id and
    the NUMA node it hangs off (NVML's, else sysfs `/sys/bus/pci/devices/<bus id>/numa_node`; -1
    unknown). NVML opens no CUDA context: the launcher reads GPUs through it."""

    index: int
    name: str
    pcie_gen: int | None
    pcie_gen_max: int | None
    pcie_width: int | None
    pcie_width_max: int | None
    nvlinks_active: int
    memory_free_bytes: int | None = None
    bus_id: str | None = None
    numa_node: int = -1


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
    try:
        free = int(pynvml.nvmlDeviceGetMemoryInfo(h).free)
    except pynvml.NVMLError:
        free = None
    try:
        bus = pynvml.nvmlDeviceGetPciInfo(h).busId
        bus = bus.decode() if isinstance(bus, bytes) else str(bus)
    except pynvml.NVMLError:
        bus = None
    numa = ask(pynvml.nvmlDeviceGetNumaNodeId) if hasattr(pynvml, "nvmlDeviceGetNumaNodeId") else None
    return GpuFacts(i, name.decode() if isinstance(name, bytes) else str(name),
                    ask(pynvml.nvmlDeviceGetCurrPcieLinkGeneration), ask(pynvml.nvmlDeviceGetMaxPcieLinkGeneration),
                    ask(pynvml.nvmlDeviceGetCurrPcieLinkWidth), ask(pynvml.nvmlDeviceGetMaxPcieLinkWidth), active,
                    free, bus, numa if numa is not None and numa >= 0 else sysfs_numa_node(bus))


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's bus id ("00000000:3B:00.0", an 8-digit domain) as sysfs names it ("0000:3b:00.0")."""
    domain, rest = nvml_bus_id.strip().split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def sysfs_numa_node(nvml_bus_id: str | None, root: str = "/sys/bus/pci/devices") -> int:
    """The NUMA node of the PCI device `nvml_bus_id` from sysfs; -1 when unknown (no bus id, no
    such file, or a machine with one node, where the kernel writes -1)."""
    if not nvml_bus_id:
        return -1
    try:
        with open(f"{root}/{sysfs_bus_id(nvml_bus_id)}/numa_node", encoding="utf-8") as fh:
            text = fh.read().strip()
    except (OSError, ValueError):
        return -1
    return int(text) if text.lstrip("-").isdigit() else -1
