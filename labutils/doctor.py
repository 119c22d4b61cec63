"""Why is my busbw low? A measured all-reduce bus bandwidth held against the machine's own evidence.

`diagnose` is a pure function of plain inputs: the topology matrix (`nvidia-smi topo -m`), the
per-GPU facts NVML gives (PCIe generation and width, current and maximum; active NVLinks; the
peer-access matrix), `lspci -vvv` (ACS on the bridges, the switches above each GPU and their
uplinks), the NCCL_* environment variables, and a measurement (a busbw figure, a sweep, or an
nccl-tests log). It returns a frozen Diagnosis:

- the group's slowest path (the pair whose path is slowest: a ring crosses it, so it bounds the
  group's busbw, see `topology.group_bottleneck`) and its expected band [low, high] in decimal
  GB/s, from the link table *at the generation and width the links run at now* (`path_band`);
- `fraction` = measured busbw / the band's high end;
- the verdict: "above the wire: check the formula or NVLS" when measured > 1.05 x high;
  "as expected" when measured >= 0.85 x low; otherwise "below expected" ("no measurement" and
  "no GPU pair to judge" when there is nothing to compare);
- the likely causes, each an id of CAUSE_IDS with its evidence line and what to try.

Causes are of two kinds. Shortfall causes push the measurement below the band (gloo_backend,
messages_too_small, p2p_disabled_by_env, nvlink_inactive, no_p2p, acs_enabled,
shared_pcie_switch_uplink); band causes make the band itself low (pcie_gen_downtrained,
pcie_width_narrow, cross_socket). Ranking: when the measurement is below expected (or absent)
shortfall causes come first, otherwise band causes do; within a kind, causes shown by the
machine's own evidence come before causes inferred (from a GPU's name, from the measurement's
shape), then in the order of the two lists above.

Live gathering (`live_facts`, `live_lspci`, `nccl_env`, `newest_sweep`) is kept apart and thin;
`run_doctor` puts files and live readings together, and `python -m labutils doctor` prints it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

# The live readers are called through their modules, so tests can fake them there.
from labutils import copies as live_copies
from labutils import pcie as live_pcie
from labutils import topology as live_readers
from labutils.fit import crossover_bytes, fit_alpha_beta
from labutils.inputs import LabInputError, check_range
from labutils.links import LinkFigure, link_figure
from labutils.nccl_tests import parse_nccl_tests
from labutils.pcie import (
    GT_PER_LANE,
    WIDTHS,
    PciDevice,
    bridges_above,
    normalize_address,
    nvidia_gpus,
    parse_lspci,
    pcie_band,
    read_lspci_file,
)
from labutils.results import DATA_DIR, REPO_ROOT, load_result, to_json
from labutils.sweep import load_sweep
from labutils.topology import (
    DEFAULT_PCIE_GEN,
    PATHS,
    GpuFacts,
    Topology,
    classify,
    expected_figure,
    group_bottleneck,
    list_samples,
    pcie_gen_of,
    read_topology_file,
    sample_pcie_gen,
)
from labutils.units import format_size

DOCTOR_DIR = DATA_DIR / "doctor"
CASES_FILE = DOCTOR_DIR / "cases.json"

CAUSE_IDS = ("cross_socket", "pcie_gen_downtrained", "pcie_width_narrow", "acs_enabled", "no_p2p",
             "p2p_disabled_by_env", "nvlink_inactive", "gloo_backend", "messages_too_small",
             "shared_pcie_switch_uplink")
SHORTFALL_ORDER = ("gloo_backend", "messages_too_small", "p2p_disabled_by_env", "nvlink_inactive", "no_p2p",
                   "acs_enabled", "shared_pcie_switch_uplink")
BAND_ORDER = ("pcie_gen_downtrained", "pcie_width_narrow", "cross_socket")

AS_EXPECTED = "as expected"
BELOW = "below expected"
ABOVE = "above the wire: check the formula or NVLS"
NO_MEASUREMENT = "no measurement"
NO_PAIR = "no GPU pair to judge"
VERDICTS = (AS_EXPECTED, BELOW, ABOVE, NO_MEASUREMENT, NO_PAIR)
AS_EXPECTED_SHARE = 0.85  # of the band's low end
ABOVE_WIRE_SHARE = 1.05  # of the band's high end

JSON_KEYS = ("verdict", "slowest_path", "expected_GBps", "measured_GBps", "fraction", "causes")
FACT_KEYS = ("index", "name", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "nvlinks_active")
# NCCL_P2P_LEVEL: P2P is used when the path is at most this level (integers are NCCL's legacy values).
P2P_LEVELS = {"LOC": 0, "NVL": 1, "PIX": 2, "PXB": 3, "PHB": 4, "SYS": 5}
P2P_LEVEL_INTS = {0: "LOC", 1: "PIX", 2: "PXB", 3: "PHB", 4: "SYS", 5: "SYS"}


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


def _band_text(fig: LinkFigure) -> str:
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
        raise LabInputError(f"facts={source!r} must be a non-empty list of per-GPU objects with keys {', '.join(FACT_KEYS)}")
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
    p = Path(path)
    if not p.is_file():
        raise LabInputError(f"facts={str(path)!r} does not exist")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
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
    if not p.is_file():
        raise LabInputError(f"sweep={str(path)!r} does not exist (give a result .json under data/results/)")
    try:
        record = json.loads(p.read_text(encoding="utf-8"))
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

    if not Path(path).is_file():
        raise LabInputError(f"nccl_tests={str(path)!r} does not exist (give an all_reduce_perf log or its -J JSON)")
    log = parse_nccl_tests(str(path))
    text = Path(path).read_text(encoding="utf-8", errors="replace")
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


# ---- the diagnosis ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Cause:
    """One likely cause: `id` from CAUSE_IDS, the evidence line, what to try. `kind` is
    "shortfall" (pushes the measurement below the band), "band" (makes the band low) or "context"
    (true, but off this path: a PCIe link of GPUs that talk over NVLink); `shown` is False when
    inferred rather than read from the machine's evidence."""

    id: str
    evidence: str
    fix: str
    kind: str = "shortfall"
    shown: bool = True


@dataclass(frozen=True)
class Diagnosis:
    """What the doctor found. `expected_GBps` is (low, high) of `band` (None without a GPU pair);
    `fraction` = measured / high. `notes` say what was assumed or could not be read."""

    verdict: str
    gpus: tuple[str, ...]
    slowest_path: dict | None
    expected_GBps: tuple[float, float] | None
    measured_GBps: float | None
    fraction: float | None
    causes: tuple[Cause, ...]
    band: LinkFigure | None = None
    measurement: Measurement | None = None
    topology_source: str = ""
    notes: tuple[str, ...] = ()

    @property
    def cause_ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.causes)

    def cause(self, cause_id: str) -> Cause | None:
        return next((c for c in self.causes if c.id == cause_id), None)

    def as_dict(self) -> dict:
        """Exactly JSON_KEYS; causes as {"id", "evidence", "fix"}."""
        return {
            "verdict": self.verdict,
            "slowest_path": self.slowest_path,
            "expected_GBps": list(self.expected_GBps) if self.expected_GBps else None,
            "measured_GBps": self.measured_GBps,
            "fraction": None if self.fraction is None else round(self.fraction, 3),
            "causes": [{"id": c.id, "evidence": c.evidence, "fix": c.fix} for c in self.causes],
        }


@dataclass(frozen=True)
class _Inputs:
    """Everything the cause rules look at (internal)."""

    topo: Topology
    group: tuple[int, ...]
    code: str
    pair: tuple[str, str]
    band: LinkFigure
    verdict: str
    facts: MachineFacts | None
    pci: tuple[PciDevice, ...] | None
    pci_gpus: dict | None
    env: dict
    m: Measurement | None
    idle_reading: bool
    pcie: LinkFigure  # the GPUs' own PCIe link as it runs now (what a switch uplink is assumed to be)

    def names(self, idx) -> str:
        return ", ".join(f"GPU{i}" for i in idx)


def _check_group(topo: Topology | None, gpus, m: Measurement | None, notes: list) -> tuple[int, ...]:
    n = len(topo.gpus) if topo is not None else 0
    if gpus is not None:
        group = parse_gpus(gpus) if isinstance(gpus, str) else tuple(gpus)
        if topo is None:
            raise LabInputError(f"gpus={','.join(map(str, group))} needs a topology: give --topo FILE "
                                "(no nvidia-smi topo -m here)")
        for g in group:
            if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < n:
                raise LabInputError(f"gpus: GPU{g} is not in the topology, which has GPU0..GPU{n - 1}")
        if len(set(group)) < 2 or len(set(group)) != len(group):
            raise LabInputError(f"gpus={','.join(map(str, group))} must name at least two different GPUs, each once")
        if m and m.world_size and m.world_size != len(group):
            notes.append(f"the measurement used {m.world_size} ranks but --gpus names {len(group)} GPUs")
        return group
    if n < 2:
        return ()
    if m and m.world_size and 2 <= m.world_size < n:
        notes.append(f"GPUs 0..{m.world_size - 1} assumed: the measurement used {m.world_size} ranks "
                     "(give --gpus if it ran on others)")
        return tuple(range(m.world_size))
    if m and m.world_size and m.world_size > n:
        notes.append(f"the measurement used {m.world_size} ranks, more than this topology's {n} GPUs: "
                     "between nodes the network may be the bottleneck, which the doctor does not judge")
    return tuple(range(n))


def _gpu_devices(pci, n: int, facts: MachineFacts | None, notes: list) -> dict | None:
    """GPU index -> its PciDevice: by the facts' PCI bus ids, else by address order when lspci
    lists as many NVIDIA GPUs as the topology."""
    if pci is None:
        return None
    found = nvidia_gpus(pci)
    if facts is not None and facts.bus_ids and all(facts.bus_ids):
        by_address = {(d.domain, d.bus, d.device, d.function): d for d in found}
        mapped = {i: by_address.get(normalize_address(b)) for i, b in enumerate(facts.bus_ids)}
        if all(mapped.values()):
            return mapped
    if len(found) == n:
        return dict(enumerate(found))
    notes.append(f"lspci lists {len(found)} NVIDIA GPU(s) and the topology {n}: without pci_bus_id in the facts "
                 "the doctor cannot tell which is which, so it reads only ACS from lspci")
    return None


def _facts_from_pci(pci_gpus: dict, n: int) -> MachineFacts:
    gpus = tuple(GpuFacts(i, pci_gpus[i].name, pci_gpus[i].gen, pci_gpus[i].cap_gen, pci_gpus[i].link_width,
                          pci_gpus[i].link_cap_width, None) for i in range(n))
    return MachineFacts(gpus, None, tuple(pci_gpus[i].address for i in range(n)), "lspci")


def _link_state(facts: MachineFacts | None, group, gen_assumed: int, notes: list) -> tuple[int, int, int, int]:
    """(gen now, width now, gen max, width max): the lowest over the group's GPUs."""
    fs = [facts.gpus[i] for i in group] if facts is not None else []
    gens = [f.pcie_gen for f in fs if f.pcie_gen]
    widths = [f.pcie_width for f in fs if f.pcie_width]
    if not gens or not widths:
        notes.append(f"PCIe {'generation' if not gens else 'width'} of the GPUs not known: assumed "
                     f"gen {gen_assumed} x16 (give --facts, NVML's table)")
    gen_now, width_now = min(gens or [gen_assumed]), min(widths or [16])
    gen_max = min([f.pcie_gen_max for f in fs if f.pcie_gen_max] or [gen_now])
    width_max = min([f.pcie_width_max for f in fs if f.pcie_width_max] or [width_now])
    return gen_now, width_now, max(gen_max, gen_now), max(width_max, width_now)


def _verdict(measured: float | None, band: LinkFigure | None) -> str:
    if band is None:
        return NO_PAIR if measured is not None else NO_MEASUREMENT
    if measured is None:
        return NO_MEASUREMENT
    if measured > ABOVE_WIRE_SHARE * band.high_GBps:
        return ABOVE
    return AS_EXPECTED if measured >= AS_EXPECTED_SHARE * band.low_GBps else BELOW


def diagnose(topo: Topology | None, gpus=None, facts: MachineFacts | None = None,
             pci: tuple[PciDevice, ...] | None = None, env: dict | None = None,
             measurement: Measurement | None = None, pcie_gen_assumed: int = DEFAULT_PCIE_GEN) -> Diagnosis:
    """Diagnose the GPUs `gpus` (indices; default: the measurement's first N, else all) of `topo`.

    Raises LabInputError for a GPU index not in the topology, facts whose GPU count differs from
    the topology's, or fewer than two GPUs named. See the module docstring for the rules.
    """
    notes: list[str] = []
    env = {str(k): str(v) for k, v in (env or {}).items() if str(k).startswith("NCCL_")}
    n = len(topo.gpus) if topo is not None else 0
    if facts is not None and topo is not None and len(facts.gpus) != n:
        raise LabInputError(f"facts={facts.source!r} describe {len(facts.gpus)} GPU(s) but the topology "
                            f"({topo.source}) has {n}: they must come from the same machine")
    group = _check_group(topo, gpus, measurement, notes)
    measured = measurement.busbw_GBps if measurement is not None else None
    if env:
        notes.append("NCCL variables set: " + ", ".join(f"{k}={v}" for k, v in sorted(env.items())))
    if not group:
        if topo is None:
            notes.append("no topology: the doctor needs `nvidia-smi topo -m` (or --topo FILE) to judge a GPU link")
        elif n < 2:
            notes.append(f"the topology has {n} GPU: there is no GPU-to-GPU link to judge")
        causes = _measurement_causes(measurement)
        return Diagnosis(_verdict(measured, None), tuple(topo.gpus) if topo else (), None, None, measured, None,
                         tuple(causes), None, measurement, topo.source if topo else "", tuple(notes))
    pci_gpus = _gpu_devices(pci, n, facts, notes)
    if facts is None and pci_gpus is not None:
        facts = _facts_from_pci(pci_gpus, n)
        notes.append("PCIe generation and width read from lspci (LnkSta / LnkCap)")
    worst = group_bottleneck(topo, list(group))
    code = "SYS" if worst.code == "SOC" else worst.code
    gen_now, width_now, gen_max, width_max = _link_state(facts, group, pcie_gen_assumed,
                                                         notes if not code.startswith("NV") else [])
    band = path_band(code, gen_now, width_now)
    idle = False
    if measured is not None and not code.startswith("NV") and (gen_now, width_now) != (gen_max, width_max):
        band_max = path_band(code, gen_max, width_max)
        if ABOVE_WIRE_SHARE * band.high_GBps < measured <= ABOVE_WIRE_SHARE * band_max.high_GBps:
            idle = True
            notes.append(f"the facts say PCIe gen {gen_now} x{width_now}, but {measured:g} GB/s is more than that "
                         f"carries: they were read while the GPU idled (GPUs lower their link to save power), "
                         f"so the band is taken at gen {gen_max} x{width_max}")
            band = band_max
    verdict = _verdict(measured, band)
    inputs = _Inputs(topo, group, code, (worst.a, worst.b), band, verdict, facts, pci, pci_gpus, env, measurement,
                     idle, pcie_band(gen_max, width_max) if idle else pcie_band(gen_now, width_now))
    causes = _rank([c for c in _causes(inputs) if c is not None], verdict)
    if verdict == ABOVE:
        notes.append("busbw above the wire: check the formula (busbw = algbw x 2(N-1)/N for all_reduce; decimal "
                     "GB/s) and, on NVSwitch machines, NVLink SHARP (NVLS) reducing in the switch: compare with "
                     "NCCL_NVLS_ENABLE=0")
    _speed, short, _words, _links = classify(code)
    slowest = {"gpus": [worst.a, worst.b], "code": code, "path": short, "link": band.name}
    return Diagnosis(verdict, tuple(f"GPU{i}" for i in group), slowest, (band.low_GBps, band.high_GBps), measured,
                     None if measured is None else measured / band.high_GBps, tuple(causes), band, measurement,
                     topo.source, tuple(notes))


def _rank(causes: list[Cause], verdict: str) -> list[Cause]:
    order = SHORTFALL_ORDER + BAND_ORDER if verdict in (BELOW, NO_MEASUREMENT) else BAND_ORDER + SHORTFALL_ORDER
    first_kind = "shortfall" if verdict in (BELOW, NO_MEASUREMENT) else "band"
    return sorted(causes, key=lambda c: (c.kind != first_kind, c.kind == "context", not c.shown, order.index(c.id)))


def _causes(c: _Inputs) -> list[Cause | None]:
    staged = _staging(c)
    return [*_measurement_causes(c.m), _env_cause(c, staged), _nvlink_cause(c, staged), _p2p_cause(c, staged),
            _acs_cause(c), _uplink_cause(c, staged), *_link_causes(c), _socket_cause(c)]


# ---- the rules ----------------------------------------------------------------------------------

def _measurement_causes(m: Measurement | None) -> list[Cause]:
    out = []
    if m is None:
        return out
    if (m.backend or "").lower() == "gloo":
        gloo, sys_row = link_figure("gloo through host memory"), link_figure("PCIe 5.0 x16 across sockets (SYS)")
        where = " on CPU tensors (no GPU link at all)" if (m.device or "").startswith("cpu") else ""
        out.append(Cause("gloo_backend",
                         f"The measurement ({m.source}) ran the gloo backend{where}: gloo moves the data through "
                         f"host memory with the CPU, so it measures the CPU's path, not the GPU link (the article: "
                         f"gloo {gloo.low_GBps:g} GB/s against NCCL {sys_row.low_GBps:g} GB/s on the same two GPUs).",
                         "Measure with NCCL, one rank per GPU: `python -m labutils sweep --backend nccl --nproc N` "
                         "or nccl-tests' all_reduce_perf; keep gloo as the slow comparison only."))
    if m.crossover_bytes and m.peak_size_bytes is not None and m.peak_size_bytes < m.crossover_bytes:
        out.append(Cause("messages_too_small",
                         f"The highest busbw ({m.busbw_GBps:.3g} GB/s) came at {_size(m.peak_size_bytes)}, "
                         f"below the alpha-beta crossover of {_size(m.crossover_bytes)} (alpha ~ "
                         f"{m.alpha_us:.0f} us, fitted busbw ~ {m.fitted_busbw_GBps:.3g} GB/s): there the fixed "
                         "cost is at least half the time, so busbw reads at most half of what the link carries.",
                         "Sweep to larger messages (`python -m labutils sweep --max-bytes 256M`, nccl-tests "
                         "`-e 256M`) and read busbw where it levels off."))
    return out


def _size(nbytes: float) -> str:
    text = format_size(nbytes)
    return text + "iB" if text[-1] in "KMG" else text


def _truthy(value: str) -> bool | None:
    try:
        return int(value.strip()) != 0
    except ValueError:
        return None


def _p2p_level(value: str) -> int | None:
    text = value.strip().upper()
    if text in P2P_LEVELS:
        return P2P_LEVELS[text]
    try:
        return P2P_LEVELS[P2P_LEVEL_INTS[int(text)]]
    except (ValueError, KeyError):
        return None


def _path_level(code: str) -> int:
    if code.startswith("NV"):
        return P2P_LEVELS["NVL"]
    return P2P_LEVELS["PHB"] if code in ("PHB", "NODE") else P2P_LEVELS[code]


def _env_blocks_p2p(c: _Inputs) -> list[str]:
    """Sentences for the NCCL variables that keep P2P off this path."""
    out = []
    if "NCCL_P2P_DISABLE" in c.env and _truthy(c.env["NCCL_P2P_DISABLE"]):
        out.append(f"NCCL_P2P_DISABLE={c.env['NCCL_P2P_DISABLE']} is set: NCCL uses no peer-to-peer at all "
                   "(neither NVLink nor PCIe) and copies through host memory (SHM) instead")
    if "NCCL_P2P_LEVEL" in c.env:
        level = _p2p_level(c.env["NCCL_P2P_LEVEL"])
        if level is not None and _path_level(c.code) > level:
            out.append(f"NCCL_P2P_LEVEL={c.env['NCCL_P2P_LEVEL']} is set: NCCL uses peer-to-peer only up to that "
                       f"level, and {c.pair[0]}-{c.pair[1]} is {c.code}, so it copies through host memory instead")
    return out


@dataclass(frozen=True)
class _Staging:
    """Does NCCL copy through host memory (SHM) instead of GPU to GPU? `shown` by the p2p matrix
    (`false_pairs`), the environment (`env`, sentences) or the log (`log_shm`); `inferred` from
    consumer GPU names (`geforce`, indices)."""

    shown: bool
    inferred: bool
    false_pairs: tuple[tuple[int, int], ...]
    env: tuple[str, ...]
    log_shm: bool
    geforce: tuple[int, ...]

    @property
    def any(self) -> bool:
        return self.shown or self.inferred


def _staging(c: _Inputs) -> _Staging:
    pairs = ()
    if c.facts is not None and c.facts.p2p is not None:
        p = c.facts.p2p
        pairs = tuple((a, b) for a, b in itertools.combinations(c.group, 2) if not (p[a][b] and p[b][a]))
    env = tuple(_env_blocks_p2p(c))
    log_shm = bool(c.m and "SHM" in c.m.transports and "P2P" not in c.m.transports)
    geforce = tuple(i for i in c.group if c.facts is not None and "geforce" in (c.facts.gpus[i].name or "").lower())
    p2p_known = c.facts is not None and c.facts.p2p is not None
    inferred = (not p2p_known and not log_shm and bool(geforce) and not c.code.startswith("NV"))
    return _Staging(bool(pairs) or bool(env) or log_shm, inferred, pairs, env, log_shm, geforce)


def _env_cause(c: _Inputs, s: _Staging) -> Cause | None:
    lines = list(s.env)
    if "NCCL_SHM_DISABLE" in c.env and _truthy(c.env["NCCL_SHM_DISABLE"]) and (s.any or c.verdict == BELOW):
        lines.append(f"NCCL_SHM_DISABLE={c.env['NCCL_SHM_DISABLE']} is set: without peer-to-peer, NCCL is left "
                     "with its network transport (sockets over loopback), slower still")
    if not lines:
        return None
    return Cause("p2p_disabled_by_env", "; ".join(lines) + ".",
                 "Unset it (" + ", ".join(f"`unset {k}`" for k in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL",
                                                                   "NCCL_SHM_DISABLE") if k in c.env)
                 + ") and measure again: these are debugging switches. `NCCL_DEBUG=INFO` shows the transport "
                   "NCCL picks (`via P2P/...` is direct, `via SHM` is through host memory).")


def _nvlink_cause(c: _Inputs, s: _Staging) -> Cause | None:
    if not c.code.startswith("NV"):
        return None
    links = int(c.code[2:])
    fix = ("Check the links: `nvidia-smi nvlink --status` (and `nvidia-smi nvlink -e` for errors). On an NVSwitch "
           "machine (HGX/DGX) the nvidia-fabricmanager service must be running; on a bridged pair, reseat the "
           "bridge. Then read `nvidia-smi topo -m` again, and make sure NCCL_P2P_DISABLE is not set.")
    if c.facts is not None:
        low = [(i, c.facts.gpus[i].nvlinks_active) for i in c.group
               if c.facts.gpus[i].nvlinks_active is not None and c.facts.gpus[i].nvlinks_active < links]
        if low:
            counts = ", ".join(f"{a} on GPU{i}" for i, a in low)
            return Cause("nvlink_inactive",
                         f"The matrix reads {c.code} between the GPUs, but NVML counts active NVLinks (of {links}): "
                         f"{counts}. Without them the bytes fall back to PCIe, far below NVLink's "
                         f"{_band_text(c.band)}.", fix)
    if c.verdict == BELOW and not s.shown:
        return Cause("nvlink_inactive",
                     f"The matrix reads {c.code}, but {c.m.busbw_GBps:g} GB/s is far below NVLink's "
                     f"{_band_text(c.band)}: the NVLinks are not carrying the traffic (links inactive, or "
                     "peer-to-peer disabled).", fix, shown=False)
    return None


def _p2p_cause(c: _Inputs, s: _Staging) -> Cause | None:
    fix = ("Check `nvidia-smi topo -p2p r` (OK means direct). Consumer (GeForce) cards: accept it, or use cards "
           "with peer-to-peer (workstation or datacenter parts, or an NVLink bridge). Otherwise look for ACS or "
           "the IOMMU blocking it (`lspci -vvv | grep ACSCtl`, see acs_enabled).")
    consumer = (f" They are GeForce cards ({c.facts.gpus[s.geforce[0]].name}), on which the driver does not "
                "offer PCIe peer-to-peer.") if s.geforce and c.facts is not None else ""
    allowed = [k for k in ("NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE") if k in c.env]
    if allowed and not s.env:
        consumer += f" ({', '.join(f'{k}={c.env[k]}' for k in allowed)} is set but does not block this path.)"
    if s.false_pairs:
        pairs = ", ".join(f"GPU{a}-GPU{b}" for a, b in s.false_pairs[:4]) + (" ..." if len(s.false_pairs) > 4 else "")
        return Cause("no_p2p", f"The p2p matrix says {pairs} cannot access each other's memory directly: NCCL "
                               f"stages every byte through host memory (SHM), two PCIe trips instead of one."
                     + consumer, fix)
    if s.log_shm and not s.env:
        return Cause("no_p2p", f"NCCL's own log ({c.m.source}) shows its channels going `via SHM`: the bytes were "
                               "copied through host memory, not GPU to GPU." + consumer, fix)
    if s.inferred:
        return Cause("no_p2p", f"{c.names(s.geforce)} are GeForce cards ({c.facts.gpus[s.geforce[0]].name}): the "
                               "driver does not offer PCIe peer-to-peer between consumer cards, so NCCL stages "
                               "through host memory (SHM). Inferred from the name: give the p2p matrix to be sure.",
                     fix, shown=False)
    return None


def _acs_bridges(c: _Inputs) -> tuple[list[PciDevice], bool]:
    """(bridges with ACS on that matter here, whether they are known to sit above the group's GPUs)."""
    if c.pci is None:
        return [], False
    if c.pci_gpus is not None and any(b.secondary_bus is not None for b in c.pci):
        above = {b.address: b for i in c.group for b in bridges_above(c.pci, c.pci_gpus[i])}
        return [b for b in above.values() if b.acs_on], True
    return [b for b in c.pci if b.is_bridge and b.acs_on], False


def _acs_cause(c: _Inputs) -> Cause | None:
    found, placed = _acs_bridges(c)
    if not found:
        return None
    shown = "; ".join(f"{b.address} ({b.port_type or b.class_name}) ACSCtl {' '.join(f + '+' for f in b.acs_on)}"
                      for b in found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
    where = f"above {c.names(c.group)}" if placed else "(which GPUs sit below them is not known from this file)"
    switch = (f" So the {c.code} path of the matrix is not the path the bytes take: they climb to the CPU and back."
              if c.code in ("PIX", "PXB") else "")
    return Cause("acs_enabled",
                 f"PCIe Access Control Services are on at {len(found)} bridge(s) {where}: {shown}. Peer requests "
                 f"are redirected up to the root complex (and the IOMMU) instead of turning round in the switch, "
                 f"or refused.{switch}",
                 "On bare metal turn ACS off: the BIOS setting (often 'ACS' or 'PCIe ACS Control'), or per bridge as "
                 "root `setpci -s BDF ECAP_ACS+0x6.w=0000` (NCCL's troubleshooting guide); in a VM ACS serves "
                 "passthrough, so ask the provider. Afterwards `lspci -vvv | grep ACSCtl` should show only minus signs.")


def _switch_groups(c: _Inputs) -> list[tuple[tuple[int, ...], str, LinkFigure | None]]:
    """(group GPUs behind one PCIe switch, how it is known, the switch uplink's band or None)."""
    out = []
    if c.pci_gpus is not None and any(b.secondary_bus is not None for b in c.pci):
        ports = {}
        for i in c.group:
            for b in bridges_above(c.pci, c.pci_gpus[i]):
                if b.port_type == "Upstream Port":
                    ports.setdefault(b.address, (b, []))[1].append(i)
        for b, inside in ports.values():
            uplink = pcie_band(b.gen, b.link_width) if b.gen and b.link_width in WIDTHS else None
            out.append((tuple(inside), f"upstream port {b.address}, {b.link_text()}", uplink))
        return [g for g in out if len(g[0]) >= 2]
    parent = {i: i for i in c.group}

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for a, b in itertools.combinations(c.group, 2):
        if c.topo.link(a, b) in ("PIX", "PXB"):
            parent[root(b)] = root(a)
    clusters = {}
    for i in c.group:
        clusters.setdefault(root(i), []).append(i)
    return [(tuple(v), "PIX/PXB between them in the matrix: one switch tree", None) for v in clusters.values() if len(v) >= 2]


def _uplink_cause(c: _Inputs, s: _Staging) -> Cause | None:
    """A switch uplink shared by k GPUs: staged through host memory, all k send up it at once (share
    = uplink / k); with P2P, a ring leaving the switch crosses it once each way (share = uplink)."""
    worst = None
    for inside, how, uplink in _switch_groups(c):
        staged = s.any
        if not staged and len(inside) == len(c.group):
            continue  # peer traffic turns round inside the switch
        if c.code.startswith("NV"):
            continue
        link = uplink or c.pcie
        streams = len(inside) if staged else 1
        share = link.high_GBps / streams
        if share < 0.99 * c.band.high_GBps and (worst is None or share < worst[0]):
            worst = (share, inside, how, link, streams, staged)
    if worst is None:
        return None
    share, inside, how, link, streams, staged = worst
    if staged:
        why = (f"peer traffic goes through host memory, so all {streams} send up that one link at once: about "
               f"{share:.3g} GB/s each")
    else:
        why = f"the ring leaves the switch through it: at most {share:.3g} GB/s"
    assumed = "" if "upstream port" in how else f" (uplink assumed {link.name}; give --lspci to read it)"
    return Cause("shared_pcie_switch_uplink",
                 f"{c.names(inside)} sit behind one PCIe switch ({how}){assumed}, whose uplink to the CPU carries "
                 f"{_band_text(link)}; {why}, below the path's {_band_text(c.band)}.",
                 "Spread the job over GPUs behind different switches, or use fewer GPUs per switch; with peer-to-peer "
                 "working, traffic between GPUs of one switch never touches the uplink. Check that the switch's "
                 "uplink trains at full width (`lspci -vvv`, LnkSta of the upstream port).",
                 shown=s.shown or not staged)


def _link_causes(c: _Inputs) -> list[Cause]:
    if c.facts is None or c.idle_reading:
        return []
    kind = "context" if c.code.startswith("NV") else "band"
    nv = (" The GPUs talk over NVLink here; this PCIe link carries host copies and network traffic."
          if kind == "context" else "")
    gen_lines, width_lines = [], []
    for i in c.group:
        f = c.facts.gpus[i]
        width = f.pcie_width or 16
        if f.pcie_gen and f.pcie_gen_max and f.pcie_gen < f.pcie_gen_max:
            now, top = pcie_band(f.pcie_gen, width), pcie_band(f.pcie_gen_max, width)
            gen_lines.append(f"GPU{i} runs PCIe gen {f.pcie_gen} of its maximum gen {f.pcie_gen_max} (x{width}): "
                             f"{_band_text(now)} instead of {_band_text(top)} per direction, "
                             f"{now.high_GBps / top.high_GBps:.0%} of it")
        if f.pcie_width and f.pcie_width_max and f.pcie_width < f.pcie_width_max:
            gen = f.pcie_gen or DEFAULT_PCIE_GEN
            now, top = pcie_band(gen, f.pcie_width), pcie_band(gen, f.pcie_width_max)
            width_lines.append(f"GPU{i} links at x{f.pcie_width} of its x{f.pcie_width_max} lanes (gen {gen}): "
                               f"{_band_text(now)} instead of {_band_text(top)} per direction, "
                               f"{now.high_GBps / top.high_GBps:.0%} of it")
    out = []
    if gen_lines:
        out.append(Cause("pcie_gen_downtrained", "; ".join(gen_lines) + "." + nv,
                         "Read it again under load (`nvidia-smi -q -d PCIE` while a sweep runs): idle GPUs lower "
                         "their generation to save power. If it stays low, check the BIOS PCIe speed setting of "
                         "the slot, the riser or cable, and reseat the card.", kind))
    if width_lines:
        out.append(Cause("pcie_width_narrow", "; ".join(width_lines) + "." + nv,
                         "Move the card to a slot wired x16 (some x16-sized slots are x8, or share lanes with "
                         "another slot or an M.2 drive), check the BIOS bifurcation setting and the riser, and "
                         "reseat the card.", kind))
    return out


def best_group(topo: Topology, size: int) -> tuple[tuple[int, ...], int] | None:
    """The `size` GPUs whose slowest path is fastest (ties: lowest indices) and that path's speed
    rank (`topology.classify`); None when there are too many combinations to try."""
    n = len(topo.gpus)
    if size > n or math.comb(n, size) > 50_000:
        return None
    rank = {(a, b): classify(topo.link(a, b))[0] for a, b in itertools.combinations(range(n), 2)}
    best = max(itertools.combinations(range(n), size),
               key=lambda g: min(rank[p] for p in itertools.combinations(g, 2)))
    return best, min(rank[p] for p in itertools.combinations(best, 2))


def _socket_cause(c: _Inputs) -> Cause | None:
    if c.code != "SYS":
        return None
    a, b = (int(x[3:]) for x in c.pair)

    def where(i):
        numa, cpus = c.topo.numa_affinity[i], c.topo.cpu_affinity[i]
        return f"GPU{i} on " + (f"NUMA node {numa} (CPUs {cpus})" if numa else f"CPUs {cpus}" if cpus else "its socket")

    sys_row = link_figure("PCIe 5.0 x16 across sockets (SYS)")
    evidence = (f"{c.pair[0]}-{c.pair[1]} reads SYS: every byte crosses PCIe, the CPU's root complex and the "
                f"socket-to-socket link (QPI/UPI/Infinity Fabric); {where(a)}, {where(b)}. The article measured "
                f"{sys_row.low_GBps:g} GB/s on such a path where a clean PCIe 5.0 x16 gives ~50: expect "
                f"{_band_text(c.band)} here.")
    found = best_group(c.topo, len(c.group))
    sys_rank = PATHS["SYS"][0]
    if found and found[1] > sys_rank:
        g, r = found
        path = group_bottleneck(c.topo, list(g))
        fix = (f"Pick GPUs on one socket: {', '.join(f'GPU{i}' for i in g)} (slowest path {path.code}, "
               f"{path.path_class}), e.g. CUDA_VISIBLE_DEVICES={','.join(map(str, g))}; or accept it: "
               f"{_band_text(c.band)} is what a path across sockets carries.")
    else:
        fix = (f"Accept it: no {len(c.group)} GPUs here avoid the socket-to-socket link, and {_band_text(c.band)} "
               "is what it carries; for more, rent a machine whose GPUs share a socket, a PCIe switch or NVLink.")
    return Cause("cross_socket", evidence, fix, "band")


# ---- text --------------------------------------------------------------------------------------

def _shown_path(source: str) -> str:
    """A file inside the repository as a path relative to its root; anything else as it is."""
    try:
        return str(Path(source).resolve().relative_to(REPO_ROOT))
    except (ValueError, OSError):
        return source


def format_diagnosis(d: Diagnosis, width: int = 100) -> str:
    """The report `python -m labutils doctor` prints."""
    def wrap(label, text, indent=14):
        return textwrap.fill(text, width, initial_indent=label.ljust(indent), subsequent_indent=" " * indent)

    group = f"GPUs {', '.join(d.gpus)}" if d.gpus else "no GPUs"
    lines = [f"The doctor: {group}" + (f"; topology {_shown_path(d.topology_source)}" if d.topology_source else "")]
    if d.slowest_path:
        p = d.slowest_path
        lines.append(wrap("Slowest path:", f"{p['gpus'][0]}-{p['gpus'][1]} = {p['code']} ({p['path']})"))
        lines.append(wrap("Expected:", f"{d.expected_GBps[0]:g}-{d.expected_GBps[1]:g} GB/s busbw ({p['link']}, "
                                       "as the links run now)"))
    if d.measurement is not None:
        m = d.measurement
        share = f", {d.fraction:.0%} of the band's high end" if d.fraction is not None else ""
        lines.append(wrap("Measured:", f"{m.busbw_GBps:.4g} GB/s ({m.source}){share}"))
    lines.append(wrap("Verdict:", d.verdict))
    if d.causes:
        lines += ["", "Likely causes, most likely first:"]
        for k, c in enumerate(d.causes, 1):
            lines.append(f"  {k}. {c.id}" + ("" if c.shown else " (inferred)"))
            lines.append(wrap("     evidence:", c.evidence, 15))
            lines.append(wrap("     try:", c.fix, 15))
    elif d.verdict == BELOW:
        lines += ["", "No cause shows in the evidence given: run with NCCL_DEBUG=INFO to see the transport NCCL "
                      "picks, and give --facts/--lspci if they were not read."]
    if d.notes:
        lines += ["", "Notes:"] + [textwrap.fill(n, width, initial_indent="  - ", subsequent_indent="    ")
                                   for n in d.notes]
    return "\n".join(lines)


# ---- shipped cases -----------------------------------------------------------------------------

def load_cases() -> list[dict]:
    """data/doctor/cases.json: one planted case per cause (and the exercise)."""
    return json.loads(CASES_FILE.read_text(encoding="utf-8"))


def _case(name: str) -> dict:
    cases = {c["name"]: c for c in load_cases()}
    if name not in cases:
        raise LabInputError(f"case={name!r} is not one of: {', '.join(cases)}")
    return cases[name]


def case_inputs(name: str) -> dict:
    """The keyword arguments of `diagnose` for a shipped case (files read from the repository)."""
    c = _case(name)
    at = lambda rel: REPO_ROOT / rel  # noqa: E731
    topo_arg = c["topo"] if c["topo"] in list_samples() else at(c["topo"])
    if c.get("busbw") is not None:
        m = measurement_from_busbw(c["busbw"], f"busbw of the case {name!r}")
    elif c.get("sweep"):
        m = read_sweep(at(c["sweep"]))
    elif c.get("nccl_tests"):
        m = read_nccl_tests(at(c["nccl_tests"]))
    else:
        m = None
    return {"topo": read_topology_file(topo_arg), "gpus": parse_gpus(c["gpus"]) if c.get("gpus") else None,
            "facts": read_facts(at(c["facts"])) if c.get("facts") else None,
            "pci": read_lspci_file(at(c["lspci"])) if c.get("lspci") else None, "env": c.get("env") or {},
            "measurement": m, "pcie_gen_assumed": sample_pcie_gen(Path(str(c["topo"])).stem)}


def doctor_case(name: str) -> Diagnosis:
    """The diagnosis of a shipped case, e.g. doctor_case("acs_enabled")."""
    return diagnose(**case_inputs(name))


def case_table(include_exercises: bool = False):
    """One row per shipped case: what it plants, its slowest path and band, the measured figure, the
    verdict and the first cause (a pandas DataFrame indexed by case)."""
    import pandas as pd

    rows = []
    for c in load_cases():
        if c["name"].startswith("exercise") and not include_exercises:
            continue
        d = doctor_case(c["name"])
        rows.append({"case": c["name"], "path": d.slowest_path["code"] if d.slowest_path else None,
                     "expected_GBps": f"{d.expected_GBps[0]:g}-{d.expected_GBps[1]:g}" if d.expected_GBps else None,
                     "measured_GBps": d.measured_GBps, "verdict": d.verdict,
                     "first cause": d.cause_ids[0] if d.causes else None, "what it plants": c["what"]})
    return pd.DataFrame(rows).set_index("case")


def facts_table(facts: MachineFacts):
    """The facts as NVML's table in notebook 01 prints them (one row per GPU)."""
    import pandas as pd

    return pd.DataFrame([g.__dict__ for g in facts.gpus]).set_index("index")


def case_command(name: str) -> str:
    """The command line that diagnoses a shipped case (run from the repository's root)."""
    c = _case(name)
    parts = [f"{k}={v}" for k, v in (c.get("env") or {}).items()] + ["python -m labutils doctor"]
    for key, flag in (("busbw", "--busbw"), ("sweep", "--sweep"), ("nccl_tests", "--nccl-tests"), ("gpus", "--gpus"),
                      ("topo", "--topo"), ("facts", "--facts"), ("lspci", "--lspci")):
        if c.get(key) is not None:
            parts.append(f"{flag} {c[key]}")
    return " ".join(parts)


# ---- live readings (thin) ------------------------------------------------------------------------

def nccl_env(environ=None) -> dict:
    """The NCCL_* variables of `environ` (this process's environment by default)."""
    return {k: v for k, v in (os.environ if environ is None else environ).items() if k.startswith("NCCL_")}


def _nvml_bus_ids(count: int) -> tuple[str | None, ...]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML: bus ids unknown
        return ()
    try:
        ids = []
        for i in range(count):
            bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).busId
            ids.append(bus.decode() if isinstance(bus, bytes) else str(bus))
        return tuple(ids)
    except Exception:  # noqa: BLE001
        return ()
    finally:
        pynvml.nvmlShutdown()


def live_facts() -> tuple[MachineFacts | None, str]:
    """NVML's facts, the peer-access matrix (torch) and bus ids of this machine, or (None, why not)."""

    gpus, why = live_readers.nvml_facts()
    if not gpus:
        return None, why
    p2p = None
    try:

        frame = live_copies.peer_access_matrix()
        if frame is not None and len(frame) == len(gpus):
            p2p = tuple(tuple(bool(v) for v in row) for row in frame.to_numpy())
    except Exception:  # noqa: BLE001 - torch without CUDA: p2p unknown
        p2p = None
    return MachineFacts(tuple(gpus), p2p, _nvml_bus_ids(len(gpus)), "NVML"), ""


def live_lspci() -> tuple[tuple[PciDevice, ...] | None, str]:
    """This machine's `lspci -vvv`, parsed, or (None, why not)."""

    text, why = live_pcie.run_lspci()
    if text is None:
        return None, why
    devices = parse_lspci(text, "lspci -vvv")
    if any(d.access_denied for d in devices):
        return devices, ("lspci could not read PCIe capabilities without root: run `sudo lspci -vvv > lspci.txt` "
                         "and pass --lspci lspci.txt to check ACS, link widths and switch uplinks")
    return devices, ""


def newest_sweep(prefer_nccl: bool = True) -> Measurement | None:
    """The newest saved all_reduce sweep (an NCCL one first when `prefer_nccl`), or None."""

    found = (load_sweep("all_reduce", backend="nccl") if prefer_nccl else None) or load_sweep("all_reduce")
    if found is None:
        return None
    meta = found.meta
    return measurement_from_frame(found.frame, meta, f"the newest saved sweep ({meta.get('backend')} on "
                                                     f"{meta.get('device')}, {meta.get('world_size')} ranks)")


def run_doctor(busbw=None, sweep=None, nccl_tests=None, gpus=None, topo=None, facts=None, lspci=None,
               env: dict | None = None, measurement: Measurement | None = None) -> Diagnosis:
    """Files where given, this machine otherwise. With `topo` (a file or sample name) nothing else
    is read live except the NCCL_* variables: the other inputs describe that machine, not this one.
    Every file is read and checked before anything live is started."""
    given = [k for k, v in (("--busbw", busbw), ("--sweep", sweep), ("--nccl-tests", nccl_tests),
                            ("measurement", measurement)) if v is not None]
    if len(given) > 1:
        raise LabInputError(f"give one measurement, not {' and '.join(given)}")
    if busbw is not None:
        measurement = measurement_from_busbw(busbw)
    elif sweep is not None:
        measurement = read_sweep(sweep)
    elif nccl_tests is not None:
        measurement = read_nccl_tests(nccl_tests)
    topology = read_topology_file(topo) if topo is not None else None
    machine = read_facts(facts) if facts is not None else None
    pci = read_lspci_file(lspci) if lspci is not None else None
    group = parse_gpus(gpus) if isinstance(gpus, str) else gpus
    notes, gen = [], DEFAULT_PCIE_GEN
    if topo is not None:
        gen = sample_pcie_gen(Path(str(topo)).stem)
    else:

        topology, why = live_readers.live_topology()
        if topology is None:
            notes.append(f"no live topology ({why}); try a shipped case: `{case_command('cross_socket')}`")
        if machine is None and topology is not None:
            machine, why = live_facts()
            if machine is None:
                notes.append(f"no NVML facts ({why})")
        if machine is not None:
            gen = pcie_gen_of(list(machine.gpus))
        if pci is None and topology is not None:
            pci, why = live_lspci()
            if why:
                notes.append(why)
        if measurement is None:
            measurement = newest_sweep(prefer_nccl=topology is not None)
    d = diagnose(topology, group, machine, pci, nccl_env() if env is None else env, measurement, gen)
    return replace(d, notes=tuple(notes) + d.notes)


# ---- command line -------------------------------------------------------------------------------

def add_cli(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="why is my busbw low? a measured link against the machine's own evidence",
                              description="Hold a measured busbw against the slowest path of the GPU group and its "
                                          "expected band, and rank the likely causes with their evidence. Live by "
                                          "default; every input can come from a file instead.")
    p.add_argument("--busbw", metavar="GBPS", help="a measured busbw in GB/s")
    p.add_argument("--sweep", metavar="RESULT", help="a saved sweep result (.json under data/results/)")
    p.add_argument("--nccl-tests", metavar="LOG", dest="nccl_tests", help="an nccl-tests log or its -J JSON")
    p.add_argument("--gpus", help="the GPUs measured, e.g. 0,1 (default: the measurement's first N, else all)")
    p.add_argument("--topo", metavar="FILE", help="a saved `nvidia-smi topo -m` (or a sample name such as two_gpu_sys)")
    p.add_argument("--facts", metavar="FILE", help="per-GPU facts as JSON (NVML's table; see data/doctor/)")
    p.add_argument("--lspci", metavar="FILE", help="saved `lspci -vvv` output (run as root to include ACS and links)")
    p.add_argument("--json", action="store_true", help="print JSON: " + ", ".join(JSON_KEYS))
    p.set_defaults(func=_cli)


def _cli(args) -> int:

    d = run_doctor(busbw=args.busbw, sweep=args.sweep, nccl_tests=args.nccl_tests, gpus=args.gpus, topo=args.topo,
                   facts=args.facts, lspci=args.lspci)
    print(to_json(d.as_dict()) if args.json else format_diagnosis(d))
    return 0
