"""A sweep across nodes, read back (notebooks 02 and 05: their `multinode_result` parameter).

The batch script of `python -m labutils slurm-script` runs the sweep twice: on one node, then on
every node; each run saves its result (labutils.core.results). Given the file of the second, this
module sets its peak busbw against the intra-node one (the same job's one-node sweep beside the file,
else the notebook's own) and against the network's row of the link table (labutils.readers.links):
the figure that tells a cluster user whether the network, not the GPUs' own links, bounds the job.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from labutils.core.inputs import LabInputError
from labutils.core.results import SweepResult, list_results, load_result
from labutils.measure.sweep import compare_sentence
from labutils.model.fit import allreduce_ms
from labutils.readers.links import LinkFigure, link_figures

MAX_RESULT_BYTES = 64 << 20  # a sweep's JSON is a few kB (its CSV a few more): larger is not a result file


def read_sweep_file(path: str | os.PathLike, name: str = "multinode_result") -> SweepResult:
    """The sweep saved as `path` (a result's .json, its .csv beside it), all_reduce rows only;
    LabInputError naming `name` when it is not a regular file holding a saved all_reduce sweep."""
    file = Path(path)
    if not file.is_file():
        raise LabInputError(f"{name}={str(path)!r} is not a file (give a sweep result's .json)")
    if file.stat().st_size > MAX_RESULT_BYTES:
        raise LabInputError(f"{name}={str(path)!r} is {file.stat().st_size} bytes: not a sweep result's .json")
    try:
        record, frame = load_result(file)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError):
        raise LabInputError(f"{name}={str(path)!r} is not a saved sweep (a result .json with its .csv)") from None
    if record.get("kind") != "sweep" or frame is None or "all_reduce" not in set(frame.get("op", [])):
        raise LabInputError(f"{name}={str(path)!r} holds no all_reduce sweep (kind {record.get('kind')!r})")
    return SweepResult(frame[frame["op"] == "all_reduce"].reset_index(drop=True), record.get("meta", {}))


def same_job_one_node(result: SweepResult, directory: str | os.PathLike) -> SweepResult | None:
    """The newest all_reduce sweep in `directory` of the same SLURM job on one node (the batch
    script's first step: labutils.measure.slurm), else None."""
    job = result.meta.get("slurm_job_id")
    for path in reversed(list_results("sweep", directory) if job is not None else []):
        try:
            other = read_sweep_file(path)
        except LabInputError:
            continue
        if other.meta.get("slurm_job_id") == job and other.meta.get("nodes") == 1:
            return other
    return None


def network_row(busbw_GBps: float, named: str = "") -> LinkFigure:
    """The network's row of the link table (path_class NET) for a busbw measured across nodes: the
    row `named` (a result's meta "network") when there is one, else the slowest network whose high
    end carries the busbw, else the fastest (a sweep does not know its NIC)."""
    nets = sorted(link_figures("NET"), key=lambda f: (f.high_GBps, f.name))
    return next((f for f in nets if f.name == named), None) or next(
        (f for f in nets if f.high_GBps >= busbw_GBps), nets[-1])


@dataclass(frozen=True)
class AcrossNodes:
    """A sweep across nodes beside the intra-node one: peak busbw of each (GB/s), the network row."""

    ranks: int
    nodes: int
    hosts: tuple[str, ...]
    across_GBps: float
    intra_label: str
    intra_ranks: int
    intra_GBps: float
    network: LinkFigure
    sample: str = ""
    named: str = ""


def across_nodes(path: str | os.PathLike, intra: SweepResult | None = None) -> AcrossNodes:
    """Read the sweep across nodes at `path` and set its peak busbw against the intra-node one: the
    same job's one-node sweep beside the file (`same_job_one_node`), else `intra` (this notebook's
    sweep). LabInputError naming multinode_result for a file that is no sweep, or of one node."""
    result = read_sweep_file(path)
    nodes = int(result.meta.get("nodes") or 1)
    if nodes < 2:
        raise LabInputError(f"multinode_result={str(path)!r} ran on one node; give the sweep of every node "
                            "(the batch script's second step)")
    inside = same_job_one_node(result, Path(path).parent)
    label = "the same job's one-node sweep"
    if inside is None:
        if intra is None:
            raise LabInputError(f"multinode_result={str(path)!r}: no one-node sweep of its job beside it, and no "
                                "intra-node sweep given")
        inside, label = intra, "this machine's sweep"
    across = result.peak_busbw_GBps
    return AcrossNodes(int(result.meta.get("world_size", 0)), nodes, tuple(result.meta.get("hosts", ())), across,
                       label, int(inside.meta.get("world_size", 0)), inside.peak_busbw_GBps,
                       network_row(across, str(result.meta.get("network", ""))),
                       str(result.meta.get("sample", "")), str(result.meta.get("network", "")))


def across_nodes_report(path: str | os.PathLike, intra: SweepResult | None = None,
                        gradient_bytes: float | None = None) -> str:
    """What a sweep across nodes says, in lines built from its numbers: the ranks and nodes, busbw
    across nodes against intra-node (`compare_sentence`), share = across / the network row's high
    end, and with `gradient_bytes` the all-reduce's bandwidth term 2(N-1)/N · bytes / busbw (ms) at
    each busbw. `path` "" : one line saying how to give one."""
    if not path:
        return ("no multinode_result given; set it to a sweep across nodes (python -m labutils slurm-script), "
                "e.g. ../data/nccl_tests/sample_lab_sweep_2nodes_8xH100_ndr.json")
    c = across_nodes(path, intra)
    net = c.network
    why = "named by the result" if net.name == c.named else "the slowest that carries it"
    lines = [f"{c.sample}" if c.sample else "",
             f"{c.ranks} ranks on {c.nodes} nodes ({', '.join(c.hosts)}): peak busbw {c.across_GBps:.3g} GB/s; "
             f"{c.intra_label}, {c.intra_ranks} ranks: {c.intra_GBps:.3g} GB/s",
             compare_sentence(f"the sweep across {c.nodes} nodes", c.across_GBps, "one node alone", c.intra_GBps),
             f"the network's row of the link table: {net.name}, {net.low_GBps:g}-{net.high_GBps:g} GB/s ({net.kind}), "
             f"{why}; across nodes reached {c.across_GBps / net.high_GBps:.0%} of its {net.high_GBps:g} GB/s"]
    if gradient_bytes is not None:
        far, near = (allreduce_ms(gradient_bytes, c.ranks, bw) for bw in (c.across_GBps, c.intra_GBps))
        lines.append(f"a {gradient_bytes / 1e6:.0f} MB all-reduce on {c.ranks} ranks (bandwidth term): "
                     f"{float(far):.1f} ms at the busbw across nodes, {float(near):.1f} ms at the intra-node one")
    return "\n".join(line for line in lines if line)
