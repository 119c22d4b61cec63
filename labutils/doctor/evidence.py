"""The doctor's evidence, read from files and frames (notebooks 01 and 02); pure of this machine.

- `path_band`: the link table's band for a path at the PCIe generation and width the links run at now;
- `MachineFacts` (NVML's per-GPU table, the peer-access matrix, bus ids) from JSON (`read_facts`);
- `Measurement` (one busbw figure, with what else is known of how it was taken) from a figure, a
  saved sweep or an nccl-tests log.

The readings of this machine (NVML, lspci, the peer-access matrix, the newest saved sweep) are in
`labutils.doctor.live`; `labutils.doctor.doctor` puts them together; `labutils.doctor.rules` judges them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from labutils.core.inputs import LabInputError, check_range
from labutils.core.results import load_result
from labutils.model.fit import crossover_bytes, fit_alpha_beta
from labutils.readers.links import LinkFigure
from labutils.readers.nccl_tests import parse_nccl_tests
from labutils.readers.pcie import GT_PER_LANE, WIDTHS, normalize_address
from labutils.readers.sources import read_text
from labutils.readers.topology import DEFAULT_PCIE_GEN, GpuFacts, expected_figure

FACT_KEYS = ("index", "name", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "nvlinks_active")


# ---- bands at the links' current generation and width ---------------------------------------

def path_band(code: str, pcie_gen: int = DEFAULT_PCIE_GEN, pcie_width: int = 16) -> LinkFigure:
    """The link table's band for a path code at PCIe generation `pcie_gen` and `pcie_width` lanes,
    with the bytes going GPU to GPU: `topology.expected_figure(code, gen, p2p=True, width)`.

    NV#: the NVLink figure (PCIe does not matter). PIX/PXB/PHB/NODE: the PCIe band
    (`pcie.pcie_band`); SYS: high = the PCIe band's low (typical) figure, low = its high figure x
    (22 / 63), the article's measured SYS busbw over the PCIe 5.0 specification. A route through
    host memory is a shortfall cause (no_p2p), not a lower band.
    """
    return expected_figure(code, pcie_gen, True, pcie_width)


def band_text(fig: LinkFigure) -> str:
    return f"{fig.low_GBps:g}-{fig.high_GBps:g} GB/s"


# ---- inputs: facts, measurement, GPU list -----------------------------------------------------

@dataclass(frozen=True)
class MachineFacts:
    """Per-GPU facts (NVML's table, `topology.GpuFacts`, fields None where unknown), the
    peer-access matrix (`p2p[i][j]`: GPU i can access GPU j's memory directly; None when not
    known) and each GPU's PCI address (NVML's bus id; None where not known)."""

    gpus: tuple[GpuFacts, ...]
    p2p: tuple[tuple[bool, ...], ...] | None = None
    bus_ids: tuple[str | None, ...] = ()
    source: str = ""


def _fact_int(where: str, key: str, value, allowed=None, low=None):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise LabInputError(f"{where}: {key}={value!r} must be a whole number or null")
    value = int(value)
    if allowed is not None and value not in allowed:
        raise LabInputError(f"{where}: {key}={value} is not one of: {', '.join(map(str, allowed))}")
    if low is not None and value < low:
        raise LabInputError(f"{where}: {key}={value} is outside the allowed range [{low}, inf)")
    return value


def parse_facts(doc, source: str = "facts") -> MachineFacts:
    """Facts from JSON data: a list of per-GPU objects with FACT_KEYS (and optionally `p2p`, that
    GPU's row of the peer-access matrix, and `pci_bus_id`), or {"gpus": [...], "p2p": [[...]]}.
    Raises LabInputError naming the GPU and key."""
    matrix = None
    if isinstance(doc, dict):
        if "gpus" not in doc:
            raise LabInputError(f"facts={source!r}: an object needs a 'gpus' list (or give the list itself)")
        matrix, doc = doc.get("p2p"), doc["gpus"]
    if not isinstance(doc, list) or not doc:
        raise LabInputError(f"facts={source!r} must be a non-empty list of per-GPU objects "
                            f"with keys {', '.join(FACT_KEYS)}")
    n, gpus, rows, bus_ids = len(doc), {}, {}, {}
    for pos, entry in enumerate(doc):
        where = f"facts={source!r}, entry {pos}"
        if not isinstance(entry, dict):
            raise LabInputError(f"{where} is not an object")
        missing = [k for k in FACT_KEYS if k not in entry]
        if missing:
            raise LabInputError(f"{where} lacks key(s) {', '.join(missing)}")
        index = _fact_int(where, "index", entry["index"], allowed=range(n))
        if index is None or index in gpus:
            raise LabInputError(f"{where}: index={entry['index']!r} must be a GPU number 0..{n - 1}, each once")
        if not isinstance(entry["name"], str):
            raise LabInputError(f"{where}: name={entry['name']!r} must be a string")
        gpus[index] = GpuFacts(
            index, entry["name"],
            _fact_int(where, "pcie_gen", entry["pcie_gen"], tuple(GT_PER_LANE)),
            _fact_int(where, "pcie_gen_max", entry["pcie_gen_max"], tuple(GT_PER_LANE)),
            _fact_int(where, "pcie_width", entry["pcie_width"], WIDTHS),
            _fact_int(where, "pcie_width_max", entry["pcie_width_max"], WIDTHS),
            _fact_int(where, "nvlinks_active", entry["nvlinks_active"], low=0))
        if "p2p" in entry:
            rows[index] = entry["p2p"]
        if entry.get("pci_bus_id") is not None:
            normalize_address(entry["pci_bus_id"])
            bus_ids[index] = str(entry["pci_bus_id"])
    if rows and matrix is not None:
        raise LabInputError(f"facts={source!r}: give p2p either per GPU or as one matrix, not both")
    if rows:
        if len(rows) != n:
            raise LabInputError(f"facts={source!r}: p2p is given for {len(rows)} of {n} GPUs; give every row")
        matrix = [rows[i] for i in range(n)]
    p2p = None
    if matrix is not None:
        ok = isinstance(matrix, list) and len(matrix) == n and all(
            isinstance(r, list) and len(r) == n and all(isinstance(v, bool) for v in r) for r in matrix)
        if not ok:
            raise LabInputError(f"facts={source!r}: p2p must be {n} rows of {n} true/false values (row = GPU index)")
        p2p = tuple(tuple(r) for r in matrix)
    return MachineFacts(tuple(gpus[i] for i in range(n)), p2p,
                        tuple(bus_ids.get(i) for i in range(n)) if bus_ids else (), source)


def read_facts(path) -> MachineFacts:
    text = read_text(path, "facts")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LabInputError(f"facts={str(path)!r} is not JSON ({exc.msg}, line {exc.lineno})") from None
    return parse_facts(doc, str(path))


@dataclass(frozen=True)
class Measurement:
    """A measured busbw (decimal GB/s) and what is known about how it was measured: backend
    ("nccl", "gloo"; None when unknown), device, ranks, the message size of the figure, the α-β
    fit of its sweep (alpha, asymptotic busbw, crossover size) and the transports an NCCL log
    names ("P2P", "SHM", "NET")."""

    busbw_GBps: float
    source: str
    backend: str | None = None
    device: str | None = None
    world_size: int | None = None
    peak_size_bytes: float | None = None
    crossover_bytes: float | None = None
    alpha_us: float | None = None
    fitted_busbw_GBps: float | None = None
    transports: tuple[str, ...] = ()


def measurement_from_busbw(value, source: str = "--busbw") -> Measurement:
    """A bare figure: a number in (0, inf) GB/s, else LabInputError naming `busbw`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise LabInputError(f"busbw={value!r} must be a number in GB/s, e.g. 22") from None
    check_range("busbw", number, low=0, low_open=True, high=math.inf, high_open=True, unit="GB/s")
    return Measurement(number, source)


def measurement_from_frame(frame, meta: dict | None = None, source: str = "sweep",
                           transports: tuple[str, ...] = ()) -> Measurement:
    """The peak busbw of a sweep's all_reduce rows (out-of-place half of an nccl-tests log), with
    its size and the sweep's α-β fit (`fit.fit_alpha_beta`, `fit.crossover_bytes`)."""

    meta = meta or {}
    rows = frame
    if "op" in rows and (rows["op"] == "all_reduce").any():
        rows = rows[rows["op"] == "all_reduce"]
    if "in_place" in rows and rows["in_place"].nunique() > 1:
        rows = rows[~rows["in_place"].astype(bool)]
    rows = rows[(rows["busbw_GBps"] > 0) & rows["busbw_GBps"].map(math.isfinite)] if "busbw_GBps" in rows else rows[:0]
    if not len(rows):
        raise LabInputError(f"{source} has no row with a positive busbw_GBps")
    peak = rows.loc[rows["busbw_GBps"].idxmax()]
    backend = meta.get("backend") or (str(rows["backend"].iloc[0]) if "backend" in rows else None)
    world = meta.get("world_size")
    if world is None and "world_size" in rows and rows["world_size"].notna().all():
        world = int(rows["world_size"].iloc[0])
    alpha = cross = fitted = None
    try:
        fit = fit_alpha_beta(rows, holdout=False, source=source)
        alpha, fitted, cross = fit.alpha_us, fit.busbw_GBps, crossover_bytes(fit)
    except LabInputError:
        pass
    finite = lambda x: x if x is not None and math.isfinite(x) else None  # noqa: E731
    return Measurement(float(peak["busbw_GBps"]), source, backend, meta.get("device"),
                       int(world) if world is not None else None, float(peak["size_bytes"]), finite(cross),
                       finite(alpha), finite(fitted), transports)


def read_sweep(path) -> Measurement:
    """A saved sweep result (`results.save_result` JSON, or its CSV beside the JSON)."""

    p = Path(path)
    if p.suffix == ".csv" and p.with_suffix(".json").is_file():
        p = p.with_suffix(".json")
    text = read_text(p, "sweep", " (give a result .json under data/results/)")
    try:
        record = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LabInputError(f"sweep={str(path)!r} is not a saved result ({exc.__class__.__name__})") from None
    if not isinstance(record, dict) or record.get("kind") != "sweep" or not record.get("csv"):
        kind = record.get("kind") if isinstance(record, dict) else type(record).__name__
        raise LabInputError(f"sweep={str(path)!r} is not a saved sweep (kind {kind!r})")
    try:
        _record, frame = load_result(p)
    except (OSError, ValueError) as exc:
        raise LabInputError(f"sweep={str(path)!r}: its CSV cannot be read ({exc.__class__.__name__})") from None
    return measurement_from_frame(frame, record.get("meta") or {}, f"sweep {p.name}")


_TRANSPORT = re.compile(r"\bvia (P2P|SHM|NET)\b")


def read_nccl_tests(path) -> Measurement:
    """An nccl-tests log or -J JSON (`nccl_tests.parse_nccl_tests`); NCCL INFO lines saying
    `via P2P/...`, `via SHM/...` or `via NET/...` give the transports used."""

    text = read_text(path, "nccl_tests", " (give an all_reduce_perf log or its -J JSON)")
    log = parse_nccl_tests(str(path))
    transports = tuple(sorted(set(_TRANSPORT.findall(text))))
    meta = {"backend": "nccl", "world_size": log.meta.get("world_size"), "device": "cuda"}
    return measurement_from_frame(log.frame, meta, f"nccl-tests log {Path(path).name}", transports)


def parse_gpus(text) -> tuple[int, ...]:
    """"0,1" or "GPU0,GPU3" -> (0, 1) / (0, 3)."""
    tokens = [t.strip() for t in str(text).split(",")]
    try:
        return tuple(int(t[3:] if t.upper().startswith("GPU") else t) for t in tokens)
    except ValueError:
        raise LabInputError(f"gpus={text!r} must be GPU indices separated by commas, e.g. 0,1") from None
