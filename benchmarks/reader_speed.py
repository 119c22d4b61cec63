"""How fast the readers answer hostile or large input: a figure per case, against its target.

    .venv/bin/python benchmarks/reader_speed.py [--target-s 5]

Each case writes its file under a temporary folder and times one call of the reader a user's
command would make (`parse_nccl_tests`, `read_connections`, `parse_topology`), end to end:
- 60 MB of lines that look almost like nccl-tests rows (under the readers' 64 MB cap: refused after
  its first 100,000 lines), and 200 MB of them (refused from its size, never read);
- a 200 MB file given to the NCCL_DEBUG reader (refused from its size);
- a 64-GPU `nvidia-smi topo -m` matrix classified pair by pair (2,016 pairs);
- a 1,000-GPU matrix (refused from its header).
Prints seconds per case and PASS/FAIL against the target; the exit status is 0 either way (a
measurement, not a test). Timings on a busy machine are noisy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labutils.core.inputs import LabInputError  # noqa: E402
from labutils.readers import nccl_debug, topology  # noqa: E402
from labutils.readers.nccl_tests import parse_nccl_tests  # noqa: E402


def matrix_text(gpus: int, code: str) -> str:
    """An `nvidia-smi topo -m` matrix of `gpus` GPUs joined by `code`, with affinity columns."""
    names = [f"GPU{i}" for i in range(gpus)]
    head = "\t" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = [f"{a}\t" + "\t".join("X" if a == b else code for b in names) + "\t0-63\t0\t\tN/A" for a in names]
    return "\n".join([head, *rows, "", "Legend:", "  X    = Self"]) + "\n"


def timed(call) -> tuple[float, str]:
    """(seconds, "read" or the first words of the refusal) of one call."""
    start = time.perf_counter()
    try:
        call()
        what = "read"
    except LabInputError as exc:
        what = "refused: " + str(exc)[:70]
    return time.perf_counter() - start, what


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-s", type=float, default=5.0, help="seconds each case may take")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        junk = folder / "junk.log"
        line = b"1 2 float 3 4 5\n"
        with open(junk, "wb") as fh:
            fh.write(line * (200_000_000 // len(line)))
        under = folder / "junk_60MB.log"
        with open(under, "wb") as fh:
            fh.write(line * (60_000_000 // len(line)))
        big = folder / "big_debug.log"
        with open(big, "wb") as fh:
            fh.truncate(200_000_000)
        cases = {
            "nccl-tests reader, 60 MB of junk": lambda: parse_nccl_tests(under),
            "nccl-tests reader, 200 MB of junk": lambda: parse_nccl_tests(junk),
            "NCCL_DEBUG reader, 200 MB file": lambda: nccl_debug.read_connections(big),
            "topo -m, 64 GPUs, every pair": lambda: topology.pair_paths(
                topology.parse_topology(matrix_text(64, "NV18"))),
            "topo -m, 1,000 GPUs": lambda: topology.parse_topology(matrix_text(1000, "SYS")),
        }
        for name, call in cases.items():
            seconds, what = timed(call)
            verdict = "PASS" if seconds <= args.target_s else "FAIL"
            print(f"{verdict}  {seconds:7.2f} s  {name} ({what})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
