"""The doctor's shipped cases (data/doctor/cases.json): one planted fault per cause, and the
exercise of notebook 01. Each case names its files (topology, facts, lspci, a measurement); here
they are read into the keyword arguments of `labutils.doctor.doctor.diagnose`, and the command
line that diagnoses a case is written out. Files only: nothing of this machine is read.
"""

from __future__ import annotations

import json
from pathlib import Path

from labutils.core.inputs import LabInputError
from labutils.core.results import DATA_DIR, REPO_ROOT
from labutils.doctor.evidence import measurement_from_busbw, parse_gpus, read_facts, read_nccl_tests, read_sweep
from labutils.readers.pcie import read_lspci_file
from labutils.readers.topology import list_samples, read_topology_file, sample_pcie_gen

DOCTOR_DIR = DATA_DIR / "doctor"
CASES_FILE = DOCTOR_DIR / "cases.json"


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


def case_command(name: str) -> str:
    """The command line that diagnoses a shipped case (run from the repository's root)."""
    c = _case(name)
    parts = [f"{k}={v}" for k, v in (c.get("env") or {}).items()] + ["python -m labutils doctor"]
    for key, flag in (("busbw", "--busbw"), ("sweep", "--sweep"), ("nccl_tests", "--nccl-tests"), ("gpus", "--gpus"),
                      ("topo", "--topo"), ("facts", "--facts"), ("lspci", "--lspci")):
        if c.get(key) is not None:
            parts.append(f"{flag} {c[key]}")
    return " ".join(parts)
