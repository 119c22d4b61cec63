"""Copy bandwidth over the wires of this machine: host to GPU and back (pinned memory, so the
copy is one DMA over PCIe), GPU to GPU for each pair, and on a CPU-only machine a plain memory
copy for comparison. Which GPU pairs can reach each other directly: the peer-access matrix.

Bandwidth = size_bytes / time, decimal GB/s (units.GBps); times from labutils.measure.timing (CUDA
events on a GPU, perf_counter on the CPU), after untimed warm-up copies. Each copy is held
against the band its wire should reach (`expected_bands`: the live PCIe generation and width
from NVML, the pair's path and peer access) and stated as a fraction of the wire's rate
(`wire_fraction`: measured / the band's high end).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm.auto import tqdm

from labutils.core.busbw import GBps
from labutils.core.inputs import check_int
from labutils.measure.timing import time_loop
from labutils.readers.pcie import pcie_band
from labutils.readers.topology import expected_figure, host_link, path_route


@dataclass(frozen=True)
class CopyResult:
    """One measured copy: `kind` is "H2D", "D2H", "D2D" or "host"; `src`/`dst` name the ends."""

    kind: str
    src: str
    dst: str
    size_bytes: int
    ms: float
    GBps: float
    pinned: bool


def time_copy(dst, src, kind: str, timer_device: str, iters: int, warmup: int = 2, pinned: bool = True) -> CopyResult:
    """Time `dst.copy_(src)`: `warmup` untimed copies, then the mean of `iters` timed ones."""
    iters = check_int("iters", iters, low=1)
    ctx = torch.cuda.device(timer_device) if timer_device.startswith("cuda") else nullcontext()
    with ctx:
        for _ in range(warmup):
            dst.copy_(src, non_blocking=True)
        ms = time_loop(lambda: dst.copy_(src, non_blocking=True), iters, timer_device, sync_ranks=False)
    size = src.numel() * src.element_size()
    return CopyResult(kind, str(src.device), str(dst.device), size, ms, GBps(size, ms / 1e3), pinned)


def host_copy(size_bytes: int, iters: int = 5) -> CopyResult:
    """CPU memory to CPU memory: what moving bytes costs without any wire (the CPU-only route)."""
    n = check_int("size_bytes", size_bytes, low=1)
    src, dst = torch.ones(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
    return time_copy(dst, src, "host", "cpu", iters, pinned=False)


def h2d_d2h(device: int, size_bytes: int, iters: int = 10, pinned: bool = True) -> list[CopyResult]:
    """Host-to-device and device-to-host over PCIe for GPU `device` (pinned host memory by default)."""
    n = check_int("size_bytes", size_bytes, low=1)
    host = torch.ones(n, dtype=torch.uint8, pin_memory=pinned)
    gpu = torch.empty(n, dtype=torch.uint8, device=f"cuda:{device}")
    dev = f"cuda:{device}"
    return [time_copy(gpu, host, "H2D", dev, iters, pinned=pinned),
            time_copy(host, gpu, "D2H", dev, iters, pinned=pinned)]


def d2d(src: int, dst: int, size_bytes: int, iters: int = 10) -> CopyResult:
    """GPU `src` to GPU `dst` (directly when peer access is on, else staged by the driver)."""
    n = check_int("size_bytes", size_bytes, low=1)
    a = torch.ones(n, dtype=torch.uint8, device=f"cuda:{src}")
    b = torch.empty(n, dtype=torch.uint8, device=f"cuda:{dst}")
    return time_copy(b, a, "D2D", f"cuda:{src}", iters)


def copy_ceiling_GBps(device: int = 0, size_bytes: int = 64 << 20, iters: int = 10) -> float:
    """The slower of the pinned H2D and D2H copies of GPU `device` (GB/s): the ceiling of any
    traffic that leaves this GPU through host memory and enters a GPU again (gloo on CUDA)."""
    return min(r.GBps for r in h2d_d2h(device, size_bytes, iters))


def peer_access_matrix() -> pd.DataFrame | None:
    """`torch.cuda.can_device_access_peer(i, j)` for every pair (True on the diagonal); None without GPUs."""
    if not torch.cuda.is_available():
        return None
    n = torch.cuda.device_count()
    names = [f"GPU{i}" for i in range(n)]
    grid = [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]
    return pd.DataFrame(grid, index=names, columns=names)


def measure_copies(size_bytes: int, iters: int = 10, progress: bool = True) -> pd.DataFrame:
    """Every copy this machine can make: H2D/D2H per GPU and D2D per ordered GPU pair, or one
    host copy without GPUs. Columns of CopyResult."""
    if not torch.cuda.is_available():
        return pd.DataFrame([host_copy(size_bytes, iters).__dict__])
    n = torch.cuda.device_count()
    jobs = [("h", i, None) for i in range(n)] + [("d", i, j) for i in range(n) for j in range(n) if i != j]
    rows: list[CopyResult] = []
    for what, i, j in tqdm(jobs, desc="copies", disable=not progress):
        rows += h2d_d2h(i, size_bytes, iters) if what == "h" else [d2d(i, j, size_bytes, iters)]
    return pd.DataFrame([r.__dict__ for r in rows])


@dataclass(frozen=True)
class Band:
    """What one copy should reach: `low_GBps`..`high_GBps` from the link table, where `high_GBps`
    is the wire's rate (no copy beats it), the `route` the bytes take, the table row, and a note."""

    low_GBps: float
    high_GBps: float
    route: str
    reference: str
    note: str = ""

    def __iter__(self):  # (low, high), as the plots take it
        return iter((self.low_GBps, self.high_GBps))


def _gpu_index(device: str) -> int:
    return int(str(device).split(":")[1]) if ":" in str(device) else 0


def expected_bands(frame: pd.DataFrame, topo=None, facts=(), peers: pd.DataFrame | None = None,
                   pcie_gen: int = 4) -> list[Band | None]:
    """The expected band of each copy in `frame` (a pure function: NVML facts, topology and the
    peer-access matrix are passed in).

    H2D/D2H ride the GPU's own PCIe link: generation and width from NVML (`topology.host_link`;
    PCIe `pcie_gen`.0 x16 when `facts` has nothing for that GPU), one DMA from pinned memory.
    D2D rides the pair's path in `topo` at the lower generation and width of the two GPUs,
    peer-to-peer where `peers` says the GPUs can reach each other and through host memory where it
    says they cannot (NCCL's default when `peers` is None). Host copies cross no link: None.
    """
    by_gpu = {f.index: f for f in facts or ()}
    links = lambda i: host_link(by_gpu.get(i), i, pcie_gen)  # noqa: E731
    bands: list[Band | None] = []
    for r in frame.itertuples():
        if r.kind in ("H2D", "D2H"):
            link = links(_gpu_index(r.dst if r.kind == "H2D" else r.src))
            fig = pcie_band(link.gen, link.width)
            bands.append(Band(fig.low_GBps, fig.high_GBps, f"{link.label}, one DMA from pinned host memory",
                              fig.name, link.note))
        elif r.kind == "D2D" and topo is not None:
            i, j = _gpu_index(r.src), _gpu_index(r.dst)
            a, b = links(i), links(j)
            p2p = None if peers is None else bool(peers.iloc[i, j])
            code = topo.link(i, j)
            fig = expected_figure(code, min(a.gen, b.gen), p2p, min(a.width, b.width))
            way = path_route(code, p2p)
            note = ("no peer access: the driver copies through host memory" if p2p is False
                    else "peer access unknown: NCCL's default assumed" if p2p is None and way != "NVLink" else "")
            bands.append(Band(fig.low_GBps, fig.high_GBps, f"{code}, {way}", fig.name, note))
        else:
            bands.append(None)
    return bands


def wire_fraction(GBps: float, band: Band | None) -> float:
    """measured / the wire's rate (the band's high end): 55.4 GB/s on PCIe 5.0 x16 (63) is 0.88;
    NaN without a band."""
    if band is None or not band.high_GBps > 0:
        return float("nan")
    return float(GBps) / band.high_GBps


def copy_table(frame: pd.DataFrame, bands: list[Band | None]) -> pd.DataFrame:
    """The copies beside their expectations: kind, src, dst, GBps, expected (low-high GB/s), wire_GBps,
    of_wire (measured / wire rate), route and note."""
    rows = []
    for r, band in zip(frame.itertuples(), bands):
        rows.append({"kind": r.kind, "src": r.src, "dst": r.dst, "GBps": r.GBps,
                     "expected": f"{band.low_GBps:g}-{band.high_GBps:g}" if band else "no link",
                     "wire_GBps": band.high_GBps if band else float("nan"), "of_wire": wire_fraction(r.GBps, band),
                     "route": band.route if band else "CPU memory, no link", "note": band.note if band else ""})
    return pd.DataFrame(rows)
