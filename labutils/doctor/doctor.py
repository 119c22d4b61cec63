"""Why is my busbw low? A measured all-reduce bus bandwidth held against the machine's own evidence.

`diagnose` is a pure function of plain inputs: the topology matrix (`nvidia-smi topo -m`), the
per-GPU facts NVML gives (PCIe generation and width, current and maximum; active NVLinks; the
peer-access matrix), `lspci -vvv` (ACS on the bridges, the switches above each GPU and their
uplinks), the NCCL_* environment variables, and a measurement (a busbw figure, a sweep, or an
nccl-tests log). It returns a frozen Diagnosis:

- the pair that bounds the group's busbw (`bottleneck`: the slowest path, which a ring crosses,
  or a GPU whose own link runs slow) and its expected band [low, high] in decimal GB/s, from the
  link table *at the generation and width that pair's two links run at now* (`path_band`);
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

The evidence read from files is in `labutils.doctor.evidence`, the readings of this machine in
`labutils.doctor.live`, the shipped cases' files in `labutils.doctor.cases`, the cause rules, pure,
in `labutils.doctor.rules`. Here: `diagnose`, the report, the shipped cases' diagnoses, and
`run_doctor`, which puts files and live readings together for `python -m labutils doctor`.
"""

from __future__ import annotations

import itertools
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from labutils.core.inputs import LabInputError
from labutils.core.results import REPO_ROOT, to_json
from labutils.doctor import live
from labutils.doctor.cases import case_inputs, load_cases
from labutils.doctor.evidence import (
    MachineFacts,
    Measurement,
    measurement_from_busbw,
    parse_gpus,
    path_band,
    read_facts,
    read_nccl_tests,
    read_sweep,
)
from labutils.doctor.rules import (
    ABOVE,
    ABOVE_WIRE_SHARE,
    AS_EXPECTED,
    AS_EXPECTED_SHARE,
    BELOW,
    NO_MEASUREMENT,
    NO_PAIR,
    Cause,
    RuleInputs,
    all_causes,
    measurement_causes,
    rank_causes,
)
from labutils.readers.links import LinkFigure
from labutils.readers.pcie import PciDevice, normalize_address, nvidia_gpus, pcie_band, read_lspci_file
from labutils.readers.topology import (
    DEFAULT_PCIE_GEN,
    GpuFacts,
    Topology,
    classify,
    read_topology_file,
    sample_pcie_gen,
)

JSON_KEYS = ("verdict", "slowest_path", "expected_GBps", "measured_GBps", "fraction", "causes")


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


def _link_state(facts: MachineFacts | None, gpus, gen_assumed: int, notes: list) -> tuple[int, int, int, int]:
    """(gen now, width now, gen max, width max) of the links of `gpus`: the lowest over them."""
    fs = [facts.gpus[i] for i in gpus] if facts is not None else []
    gens = [f.pcie_gen for f in fs if f.pcie_gen]
    widths = [f.pcie_width for f in fs if f.pcie_width]
    if not gens or not widths:
        notes.append(f"PCIe {'generation' if not gens else 'width'} of the GPUs not known: assumed "
                     f"gen {gen_assumed} x16 (give --facts, NVML's table)")
    gen_now, width_now = min(gens or [gen_assumed]), min(widths or [16])
    gen_max = min([f.pcie_gen_max for f in fs if f.pcie_gen_max] or [gen_now])
    width_max = min([f.pcie_width_max for f in fs if f.pcie_width_max] or [width_now])
    return gen_now, width_now, max(gen_max, gen_now), max(width_max, width_now)


@dataclass(frozen=True)
class _Bound:
    """One pair that bounds the group: its GPUs, code, link state (now and at most) and band now."""

    a: int
    b: int
    code: str
    state: tuple[int, int, int, int]
    band: LinkFigure


def _pair_bound(topo: Topology, a: int, b: int, facts, gen_assumed: int) -> _Bound:
    code = "SYS" if topo.link(a, b) == "SOC" else topo.link(a, b)
    state = _link_state(facts, (a, b), gen_assumed, [])
    return _Bound(a, b, code, state, path_band(code, state[0], state[1]))


def bottleneck(topo: Topology, group, facts: MachineFacts | None = None,
               gen_assumed: int = DEFAULT_PCIE_GEN) -> tuple[_Bound, _Bound]:
    """(the pair that bounds the group's ring busbw, the slowest path the ring must cross), each
    with its band at *its own two GPUs'* PCIe generation and width (a healthy pair is never judged
    by another GPU's slow link).

    A ring crosses the group's slowest path (`topology.group_bottleneck`), at the crossing it
    chooses: of the pairs reading that code, the one whose band is highest. And every GPU's own
    link carries the ring's traffic: each GPU bounds it by its fastest path in the group at its link
    state. The bound is the lowest of these by the band's high end (ties: the slowest path)."""
    pairs = list(itertools.combinations(group, 2))
    rank = {p: classify(topo.link(*p))[0] for p in pairs}
    bounds = {p: _pair_bound(topo, *p, facts, gen_assumed) for p in pairs}
    slow = min(rank.values())
    crossing = max((bounds[p] for p in pairs if rank[p] == slow), key=lambda x: x.band.high_GBps)
    per_gpu = []
    for g in group:
        mine = [p for p in pairs if g in p]
        fast = max(rank[p] for p in mine)
        per_gpu.append(max((bounds[p] for p in mine if rank[p] == fast), key=lambda x: x.band.high_GBps))
    bound = min([crossing] + per_gpu, key=lambda x: x.band.high_GBps)
    return bound, crossing


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
        causes = measurement_causes(measurement)
        return Diagnosis(_verdict(measured, None), tuple(topo.gpus) if topo else (), None, None, measured, None,
                         tuple(causes), None, measurement, topo.source if topo else "", tuple(notes))
    pci_gpus = _gpu_devices(pci, n, facts, notes)
    if facts is None and pci_gpus is not None:
        facts = _facts_from_pci(pci_gpus, n)
        notes.append("PCIe generation and width read from lspci (LnkSta / LnkCap)")
    bound, crossing = bottleneck(topo, group, facts, pcie_gen_assumed)
    code, pair = bound.code, (f"GPU{bound.a}", f"GPU{bound.b}")
    gen_now, width_now, gen_max, width_max = _link_state(facts, (bound.a, bound.b), pcie_gen_assumed,
                                                         notes if not code.startswith("NV") else [])
    band = bound.band
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
    inputs = RuleInputs(topo, group, code, pair, band, verdict, facts, pci, pci_gpus, env, measurement,
                        idle, pcie_band(gen_max, width_max) if idle else pcie_band(gen_now, width_now),
                        ((f"GPU{crossing.a}", f"GPU{crossing.b}"), crossing.code,
                         band if crossing == bound else crossing.band))
    causes = rank_causes([c for c in all_causes(inputs) if c is not None], verdict)
    if verdict == ABOVE:
        notes.append("busbw above the wire: check the formula (busbw = algbw x 2(N-1)/N for all_reduce; decimal "
                     "GB/s) and, on NVSwitch machines, NVLink SHARP (NVLS) reducing in the switch: compare with "
                     "NCCL_NVLS_ENABLE=0")
    _speed, short, _words, _links = classify(code)
    slowest = {"gpus": list(pair), "code": code, "path": short, "link": band.name}
    return Diagnosis(verdict, tuple(f"GPU{i}" for i in group), slowest, (band.low_GBps, band.high_GBps), measured,
                     None if measured is None else measured / band.high_GBps, tuple(causes), band, measurement,
                     topo.source, tuple(notes))


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
        lines.append(wrap("Bottleneck:", f"{p['gpus'][0]}-{p['gpus'][1]} = {p['code']} ({p['path']})"))
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

def doctor_case(name: str) -> Diagnosis:
    """The diagnosis of a shipped case, e.g. doctor_case("acs_enabled")."""
    return diagnose(**case_inputs(name))


def case_table(include_exercises: bool = False):
    """One row per shipped case: what it plants, its slowest path and band, the measured figure (to
    three significant figures, as the band is printed), the verdict and the first cause (a pandas
    DataFrame indexed by case)."""
    rows = []
    for c in load_cases():
        if c["name"].startswith("exercise") and not include_exercises:
            continue
        d = doctor_case(c["name"])
        rows.append({"case": c["name"], "path": d.slowest_path["code"] if d.slowest_path else None,
                     "expected_GBps": f"{d.expected_GBps[0]:g}-{d.expected_GBps[1]:g}" if d.expected_GBps else None,
                     "measured_GBps": None if d.measured_GBps is None else float(f"{d.measured_GBps:.3g}"),
                     "verdict": d.verdict,
                     "first cause": d.cause_ids[0] if d.causes else None, "what it plants": c["what"]})
    return pd.DataFrame(rows).set_index("case")


def facts_table(facts: MachineFacts):
    """The facts as NVML's table in notebook 01 prints them (one row per GPU)."""
    return pd.DataFrame([g.__dict__ for g in facts.gpus]).set_index("index")


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
        topology, machine, pci, measurement, gen, notes = live.read_this_machine(machine, pci, measurement, gen)
    d = diagnose(topology, group, machine, pci, live.nccl_env() if env is None else env, measurement, gen)
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
