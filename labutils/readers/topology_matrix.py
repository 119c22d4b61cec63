"""The matrix of `nvidia-smi topo -m` read into a frozen `Topology` (`parse_topology`), and the
shipped samples in data/topologies/ (`load_sample`, `read_topology_file`). What each link code means
and what a path carries is labutils.readers.topology_paths; the live machine and the `topo` command are
labutils.readers.topology, which re-exports both.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from labutils.core.inputs import LabInputError, check_choice
from labutils.core.results import DATA_DIR

SAMPLES_DIR = DATA_DIR / "topologies"
DEFAULT_PCIE_GEN = 4
ATTRIBUTES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CODE = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
MAX_NVLINKS = 64  # bonded NVLinks between two GPUs: 18 on today's largest parts; more is a corrupt file
_DEVICE = re.compile(r"^[A-Za-z][\w.:-]*\d$")  # GPU0, NIC3, mlx5_0: a device name ends in a digit
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")



class TopologyParseError(LabInputError):
    """`nvidia-smi topo -m` text that cannot be read; the message names the line and why."""

    def __init__(self, line_no: int | None, why: str):
        where = f"line {line_no}: " if line_no is not None else ""
        super().__init__(f"topology text, {where}{why}")
        self.line_no = line_no


@dataclass(frozen=True)
class Topology:
    """The matrix of `nvidia-smi topo -m`.

    `devices` are the header's columns in order (GPUs first, then NICs); `matrix[i][j]` is the
    link code between devices i and j. The per-GPU tuples hold CPU affinity ("0-23,48-71"),
    NUMA affinity and GPU NUMA ID as printed (None where absent or "N/A"). `nic_names` pairs
    NIC columns with the NIC legend's device names (("NIC0", "mlx5_0"), ...).
    """

    devices: tuple[str, ...]
    matrix: tuple[tuple[str, ...], ...]
    cpu_affinity: tuple[str | None, ...]
    numa_affinity: tuple[str | None, ...]
    gpu_numa_id: tuple[str | None, ...]
    nic_names: tuple[tuple[str, str], ...] = ()
    attributes: tuple[str, ...] = ()
    source: str = ""

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(d for d in self.devices if re.fullmatch(r"GPU\d+", d))

    @property
    def nics(self) -> tuple[str, ...]:
        return tuple(d for d in self.devices if d not in self.gpus)

    def link(self, a: str | int, b: str | int) -> str:
        """The code between two devices, given as names ("GPU0") or GPU indices."""
        i, j = self.devices.index(device_name(self, a)), self.devices.index(device_name(self, b))
        return self.matrix[i][j]

    def gpu_links(self) -> dict[str, dict[str, str]]:
        """{"GPU0": {"GPU1": "PHB", ...}, ...} without the diagonal."""
        return {a: {b: self.link(a, b) for b in self.gpus if b != a} for a in self.gpus}

    def nic_name(self, nic: str) -> str:
        return dict(self.nic_names).get(nic, nic)


def device_name(topo: Topology, device: str | int) -> str:
    """The name of a device given as a name ("GPU0") or a GPU index; LabInputError if absent."""
    name = f"GPU{device}" if isinstance(device, int) else str(device)
    if name not in topo.devices:
        raise LabInputError(f"device={device!r} is not one of: {', '.join(topo.devices)}")
    return name


def strip_ansi(text: str) -> str:
    """Remove terminal colour/underline/bold codes (nvidia-smi underlines its header)."""
    return _ANSI.sub("", text)


def _header(line: str, line_no: int) -> tuple[list[str], list[str]]:
    """Device columns and attribute columns of the header line."""
    cut = min([line.find(a) for a in ATTRIBUTES if a in line] or [len(line)])
    devices = line[:cut].split()
    attrs = sorted((a for a in ATTRIBUTES if a in line), key=line.find)
    leftover = line[cut:]
    for a in attrs:
        leftover = leftover.replace(a, "", 1)
    if leftover.strip():
        raise TopologyParseError(line_no, f"unknown header column(s) {leftover.split()} after the devices")
    bad = [d for d in devices if not _DEVICE.match(d)]
    if bad:
        raise TopologyParseError(line_no, f"header column {bad[0]!r} is not a device name")
    gpus = [d for d in devices if d.startswith("GPU")]
    if gpus != [f"GPU{i}" for i in range(len(gpus))] or devices[:len(gpus)] != gpus:
        raise TopologyParseError(line_no, f"GPU columns must come first as GPU0, GPU1, ... in order, got {gpus}")
    return devices, attrs


def _find_header(lines: list[str]) -> int:
    for i, line in enumerate(lines):
        tokens = line.split()
        if "GPU0" in tokens and not any(_CODE.match(t) for t in tokens):
            return i
    raise TopologyParseError(None, "no header line naming GPU0 (is this `nvidia-smi topo -m` output?)")


def parse_topology(text: str, source: str = "text") -> Topology:
    """Read `nvidia-smi topo -m` output: tab- or space-separated, with or without ANSI codes,
    NIC rows, NUMA columns or NIC legend. Raises TopologyParseError naming the line and why."""
    lines = strip_ansi(text).replace("\r", "").splitlines()
    h = _find_header(lines)
    devices, attrs = _header(lines[h], h + 1)
    n = len(devices)
    rows: dict[str, tuple[list[str], list[str], int]] = {}
    end = h + 1
    for end in range(h + 1, len(lines) + 1):
        if end == len(lines) or not lines[end].strip() or lines[end].strip().startswith("Legend"):
            break
        line_no, tokens = end + 1, lines[end].split()
        name = tokens[0]
        if name not in devices:
            raise TopologyParseError(line_no, f"row {name!r} is not one of the header's columns {devices}")
        if name in rows:
            raise TopologyParseError(line_no, f"row {name} appears twice")
        cells, rest = tokens[1:1 + n], tokens[1 + n:]
        if len(cells) < n:
            raise TopologyParseError(line_no, f"row {name} has {len(cells)} link cell(s); the header names {n} devices")
        for col, code in zip(devices, cells):
            if not _CODE.match(code):
                raise TopologyParseError(line_no, f"unknown link code {code!r} in row {name}, column {col} "
                                                  "(expected X, NV#, PIX, PXB, PHB, NODE or SYS)")
            if code.startswith("NV") and not 1 <= int(code[2:]) <= MAX_NVLINKS:
                raise TopologyParseError(line_no, f"link code {code!r} in row {name}, column {col} names "
                                                  f"{int(code[2:])} NVLinks; "
                                                  f"the allowed range is NV1 to NV{MAX_NVLINKS}")
        if len(rest) > len(attrs):
            raise TopologyParseError(line_no, f"row {name} has {len(rest)} cell(s) after the link columns "
                                              f"but the header names {len(attrs)}: {list(attrs)}")
        rows[name] = (cells, rest, line_no)
    gpus = [d for d in devices if d.startswith("GPU")]
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise TopologyParseError(end + 1, f"the matrix ends before the row(s) of {missing}")
    matrix = _square(devices, rows)
    info = {g: dict(zip(attrs, [None if v == "N/A" else v for v in rows[g][1]])) for g in gpus}
    legend = tuple((m.group(1), m.group(2)) for m in map(_NIC_LEGEND.match, lines[end:]) if m)
    return Topology(
        devices=tuple(devices), matrix=matrix,
        cpu_affinity=tuple(info[g].get("CPU Affinity") for g in gpus),
        numa_affinity=tuple(info[g].get("NUMA Affinity") for g in gpus),
        gpu_numa_id=tuple(info[g].get("GPU NUMA ID") for g in gpus),
        nic_names=legend, attributes=tuple(attrs), source=source)


def _square(devices: list[str], rows: dict) -> tuple[tuple[str, ...], ...]:
    """The full matrix; a NIC row that is absent is read from its column ("?" between two such
    NICs). Checks the diagonal and symmetry."""
    n = len(devices)
    grid = [[rows[d][0][j] if d in rows else None for j in range(n)] for d in devices]
    for i, j in itertools.product(range(n), range(n)):
        if grid[i][j] is None:
            grid[i][j] = "X" if i == j else rows[devices[j]][0][i] if devices[j] in rows else "?"
    for i, d in enumerate(devices):
        line_no = rows[d][2] if d in rows else None
        if grid[i][i] != "X":
            raise TopologyParseError(line_no, f"row {d} must read X against itself, got {grid[i][i]!r}")
        for j in range(i):
            if grid[i][j] == "X":
                raise TopologyParseError(line_no, f"row {d} reads X against {devices[j]} (X means the device itself)")
            if grid[i][j] != grid[j][i]:
                raise TopologyParseError(line_no, f"{d}-{devices[j]} reads {grid[i][j]} but {devices[j]}-{d} "
                                                  f"reads {grid[j][i]}; the matrix must be symmetric")
    return tuple(tuple(r) for r in grid)


# ---- samples ---------------------------------------------------------------------------------

def list_samples() -> list[str]:
    """Names of the shipped samples in data/topologies/ (file stems)."""
    return sorted(p.stem for p in SAMPLES_DIR.glob("*.txt"))


def sample_facts() -> pd.DataFrame:
    """data/topologies/samples.csv: name, title, gpu, pcie_gen, modelled_on."""
    return pd.read_csv(SAMPLES_DIR / "samples.csv")


def sample_pcie_gen(name: str) -> int:
    facts = sample_facts().set_index("name")
    return int(facts.loc[name, "pcie_gen"]) if name in facts.index else DEFAULT_PCIE_GEN


def read_topology_file(path: str | Path) -> Topology:
    """Parse a saved `nvidia-smi topo -m` output; a bare sample name (e.g. "two_gpu_sys") also works."""
    text = str(path)
    samples = ", ".join(list_samples())
    if not text.strip():
        raise LabInputError(f"file={text!r} names no file; give a saved `nvidia-smi topo -m` or a sample: {samples}")
    p = Path(text)
    try:
        if not p.exists() and text in list_samples():
            p = SAMPLES_DIR / f"{text}.txt"
        if p.is_dir():
            raise LabInputError(f"file={text!r} is a folder, not a saved `nvidia-smi topo -m`")
        if not p.exists():
            raise LabInputError(f"file={text!r} does not exist; samples: {samples}")
        if not p.is_file():
            raise LabInputError(f"file={text!r} is not a regular file (a device or a pipe)")
        content = p.read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError) as exc:
        if isinstance(exc, LabInputError):
            raise
        raise LabInputError(f"file={text!r} cannot be read ({type(exc).__name__}: {exc})") from None
    return parse_topology(content, source=str(p))


def load_sample(name: str) -> Topology:
    check_choice("sample", name, list_samples())
    return read_topology_file(SAMPLES_DIR / f"{name}.txt")
