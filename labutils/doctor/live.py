"""The doctor's readings of this machine, kept thin: the topology (`nvidia-smi topo -m`), NVML's
per-GPU facts with the peer-access matrix (torch) and bus ids, `lspci -vvv`, the NCCL_* variables,
and the newest saved all_reduce sweep. Each answers (reading, "") or (None, why not) and never
starts a rank.

The readers are called through the modules that define them (`topology.nvml_facts`,
`sources.run_lspci`, `copies.peer_access_matrix`, `results.load_sweep`), so a test fakes each where it
is defined. `labutils.doctor.doctor.run_doctor` calls `read_this_machine` when no topology file is given.
"""

from __future__ import annotations

import os

import pynvml

from labutils.core import results
from labutils.doctor.cases import case_command
from labutils.doctor.evidence import MachineFacts, Measurement, measurement_from_frame
from labutils.measure import copies
from labutils.readers import sources, topology
from labutils.readers.pcie import PciDevice, parse_lspci
from labutils.readers.topology import Topology, pcie_gen_of


def nccl_env(environ=None) -> dict:
    """The NCCL_* variables of `environ` (this process's environment by default)."""
    return {k: v for k, v in (os.environ if environ is None else environ).items() if k.startswith("NCCL_")}


def _nvml_bus_ids(count: int) -> tuple[str | None, ...]:
    try:
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

    gpus, why = topology.nvml_facts()
    if not gpus:
        return None, why
    p2p = None
    try:
        frame = copies.peer_access_matrix()
        if frame is not None and len(frame) == len(gpus):
            p2p = tuple(tuple(bool(v) for v in row) for row in frame.to_numpy())
    except Exception:  # noqa: BLE001 - torch without CUDA: p2p unknown
        p2p = None
    return MachineFacts(tuple(gpus), p2p, _nvml_bus_ids(len(gpus)), "NVML"), ""


def live_lspci() -> tuple[tuple[PciDevice, ...] | None, str]:
    """This machine's `lspci -vvv`, parsed, or (None, why not)."""

    text, why = sources.run_lspci()
    if text is None:
        return None, why
    devices = parse_lspci(text, "lspci -vvv")
    if any(d.access_denied for d in devices):
        return devices, ("lspci could not read PCIe capabilities without root: run `sudo lspci -vvv > lspci.txt` "
                         "and pass --lspci lspci.txt to check ACS, link widths and switch uplinks")
    return devices, ""


def newest_sweep(prefer_nccl: bool = True) -> Measurement | None:
    """The newest saved all_reduce sweep (an NCCL one first when `prefer_nccl`), or None."""

    found = results.load_sweep("all_reduce", backend="nccl") if prefer_nccl else None
    found = found or results.load_sweep("all_reduce")
    if found is None:
        return None
    meta = found.meta
    return measurement_from_frame(found.frame, meta, f"the newest saved sweep ({meta.get('backend')} on "
                                                     f"{meta.get('device')}, {meta.get('world_size')} ranks)")


def read_this_machine(facts: MachineFacts | None, pci: tuple[PciDevice, ...] | None,
                      measurement: Measurement | None, pcie_gen: int):
    """What `run_doctor` was not given, read from this machine: the topology, then (with a
    topology) NVML's facts and lspci, and the newest saved sweep when no measurement was given.
    Returns (topology, facts, pci, measurement, PCIe generation, notes on what could not be read)."""

    notes: list[str] = []
    topo: Topology | None
    topo, why = topology.live_topology()
    if topo is None:
        notes.append(f"no live topology ({why}); try a shipped case: `{case_command('cross_socket')}`")
    if facts is None and topo is not None:
        facts, why = live_facts()
        if facts is None:
            notes.append(f"no NVML facts ({why})")
    if facts is not None:
        pcie_gen = pcie_gen_of(list(facts.gpus))
    if pci is None and topo is not None:
        pci, why = live_lspci()
        if why:
            notes.append(why)
    if measurement is None:
        measurement = newest_sweep(prefer_nccl=topo is not None)
    return topo, facts, pci, measurement, pcie_gen, notes
