"""The doctor's cause rules: pure functions of the evidence (`labutils.doctor.evidence`), one per
cause in CAUSE_IDS, each returning a Cause (its evidence line and what to try) or None.

Shortfall causes push the measurement below the band (SHORTFALL_ORDER); band causes make the band
itself low (BAND_ORDER). `rank_causes` orders them as `labutils.doctor.doctor` explains.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from labutils.core.busbw import format_size
from labutils.doctor.evidence import MachineFacts, Measurement, band_text
from labutils.readers.links import LinkFigure, link_figure
from labutils.readers.pcie import WIDTHS, PciDevice, bridges_above, pcie_band
from labutils.readers.topology import (
    DEFAULT_PCIE_GEN,
    NCCL_LEGACY_LEVELS,
    NCCL_LEVELS,
    PATHS,
    Topology,
    classify,
    group_bottleneck,
    nccl_level_of,
)

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
AS_EXPECTED_SHARE = 0.85  # of the band's low end
ABOVE_WIRE_SHARE = 1.05  # of the band's high end


# NCCL_P2P_LEVEL: P2P is used when the path is at most this level (integers are NCCL's legacy values);
# NCCL's path types in its order (src/graph/topo.h), see `topology.nccl_p2p_level`.
P2P_LEVELS = {name: i for i, name in enumerate(NCCL_LEVELS)}
P2P_LEVEL_INTS = dict(enumerate(NCCL_LEGACY_LEVELS))


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
class RuleInputs:
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
    slowest: tuple[tuple[str, str], str, LinkFigure] | None = None  # the slowest path: pair, code, band

    def names(self, idx) -> str:
        return ", ".join(f"GPU{i}" for i in idx)


def rank_causes(causes: list[Cause], verdict: str) -> list[Cause]:
    order = SHORTFALL_ORDER + BAND_ORDER if verdict in (BELOW, NO_MEASUREMENT) else BAND_ORDER + SHORTFALL_ORDER
    first_kind = "shortfall" if verdict in (BELOW, NO_MEASUREMENT) else "band"
    return sorted(causes, key=lambda c: (c.kind != first_kind, c.kind == "context", not c.shown, order.index(c.id)))


def all_causes(c: RuleInputs) -> list[Cause | None]:
    staged = _staging(c)
    return [*measurement_causes(c.m), _env_cause(c, staged), _nvlink_cause(c, staged), _p2p_cause(c, staged),
            _acs_cause(c), _uplink_cause(c, staged), *_link_causes(c), _socket_cause(c)]


# ---- the rules ----------------------------------------------------------------------------------

def measurement_causes(m: Measurement | None) -> list[Cause]:
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
        return P2P_LEVELS[P2P_LEVEL_INTS[min(int(text), 5)]]  # NCCL clamps legacy values to 5
    except (ValueError, KeyError):
        return None


def _path_level(code: str) -> int:
    return P2P_LEVELS[nccl_level_of(code)]


def _env_blocks_p2p(c: RuleInputs) -> list[str]:
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


def _staging(c: RuleInputs) -> _Staging:
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


def _env_cause(c: RuleInputs, s: _Staging) -> Cause | None:
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


def _nvlink_cause(c: RuleInputs, s: _Staging) -> Cause | None:
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
                         f"{band_text(c.band)}.", fix)
    if c.verdict == BELOW and not s.shown:
        return Cause("nvlink_inactive",
                     f"The matrix reads {c.code}, but {c.m.busbw_GBps:g} GB/s is far below NVLink's "
                     f"{band_text(c.band)}: the NVLinks are not carrying the traffic (links inactive, or "
                     "peer-to-peer disabled).", fix, shown=False)
    return None


def _p2p_cause(c: RuleInputs, s: _Staging) -> Cause | None:
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


def _acs_bridges(c: RuleInputs) -> tuple[list[PciDevice], bool]:
    """(bridges with ACS on that matter here, whether they are known to sit above the group's GPUs)."""
    if c.pci is None:
        return [], False
    if c.pci_gpus is not None and any(b.secondary_bus is not None for b in c.pci):
        above = {b.address: b for i in c.group for b in bridges_above(c.pci, c.pci_gpus[i])}
        return [b for b in above.values() if b.acs_on], True
    return [b for b in c.pci if b.is_bridge and b.acs_on], False


def _acs_cause(c: RuleInputs) -> Cause | None:
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
                 "passthrough, so ask the provider. Afterwards `lspci -vvv | grep ACSCtl` should show only "
                 "minus signs.")


def _switch_groups(c: RuleInputs) -> list[tuple[tuple[int, ...], str, LinkFigure | None]]:
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
    return [(tuple(v), "PIX/PXB between them in the matrix: one switch tree", None)
            for v in clusters.values() if len(v) >= 2]


def _uplink_cause(c: RuleInputs, s: _Staging) -> Cause | None:
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
                 f"{band_text(link)}; {why}, below the path's {band_text(c.band)}.",
                 "Spread the job over GPUs behind different switches, or use fewer GPUs per switch; with peer-to-peer "
                 "working, traffic between GPUs of one switch never touches the uplink. Check that the switch's "
                 "uplink trains at full width (`lspci -vvv`, LnkSta of the upstream port).",
                 shown=s.shown or not staged)


def _link_causes(c: RuleInputs) -> list[Cause]:
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
                             f"{band_text(now)} instead of {band_text(top)} per direction, "
                             f"{now.high_GBps / top.high_GBps:.0%} of it")
        if f.pcie_width and f.pcie_width_max and f.pcie_width < f.pcie_width_max:
            gen = f.pcie_gen or DEFAULT_PCIE_GEN
            now, top = pcie_band(gen, f.pcie_width), pcie_band(gen, f.pcie_width_max)
            width_lines.append(f"GPU{i} links at x{f.pcie_width} of its x{f.pcie_width_max} lanes (gen {gen}): "
                               f"{band_text(now)} instead of {band_text(top)} per direction, "
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


def _socket_cause(c: RuleInputs) -> Cause | None:
    pair, code, band = c.slowest or (c.pair, c.code, c.band)
    if code != "SYS":
        return None
    a, b = (int(x[3:]) for x in pair)

    def where(i):
        numa, cpus = c.topo.numa_affinity[i], c.topo.cpu_affinity[i]
        return f"GPU{i} on " + (f"NUMA node {numa} (CPUs {cpus})" if numa else f"CPUs {cpus}" if cpus else "its socket")

    sys_row = link_figure("PCIe 5.0 x16 across sockets (SYS)")
    evidence = (f"{pair[0]}-{pair[1]} reads SYS: every byte crosses PCIe, the CPU's root complex and the "
                f"socket-to-socket link (QPI/UPI/Infinity Fabric); {where(a)}, {where(b)}. The article measured "
                f"{sys_row.low_GBps:g} GB/s on such a path (two GeForce cards: through host memory) where a "
                f"clean PCIe 5.0 x16 gives ~50: expect "
                f"{band_text(band)} here.")
    found = best_group(c.topo, len(c.group))
    sys_rank = PATHS["SYS"][0]
    if found and found[1] > sys_rank:
        g, r = found
        path = group_bottleneck(c.topo, list(g))
        fix = (f"Pick GPUs on one socket: {', '.join(f'GPU{i}' for i in g)} (slowest path {path.code}, "
               f"{path.path_class}), e.g. CUDA_VISIBLE_DEVICES={','.join(map(str, g))}; or accept it: "
               f"{band_text(band)} is what a path across sockets carries.")
    else:
        fix = (f"Accept it: no {len(c.group)} GPUs here avoid the socket-to-socket link, and {band_text(band)} "
               "is what it carries; for more, rent a machine whose GPUs share a socket, a PCIe switch or NVLink.")
    return Cause("cross_socket", evidence, fix, "band")
