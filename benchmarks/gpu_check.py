"""The device check: one script, at most 8 minutes on a 1-GPU, 16-core machine without network.

    python benchmarks/gpu_check.py                # from the repository root, on the GPU machine
    python benchmarks/gpu_check.py --dry-run      # the plan (steps, limits, notebook order), missing packages
    python benchmarks/gpu_check.py --device cpu   # the same steps on the CPU (gloo instead of NCCL)

It installs nothing: it uses what is importable and names any missing package (a step whose
packages are missing is skipped with that sentence; a folder on PYTHONPATH counts). In order,
with each step's limit (the default `--budget-s` 480 s, split so that the limits add up to
475 s and 5 s are left for this script's own start and summary):

1. the CUDA-only tests (`pytest -m cuda`: every test that needs a GPU, see tests/conftest.py), 60 s;
2. NCCL with one rank on the GPU: a ping (all-reduce of the rank number) and a short sweep
   (with several GPUs, also a sweep across all of them), 40 s;
3. gloo on CUDA tensors, 2 ranks sharing the GPU: the harness against a bare `dist.all_reduce`
   loop (benchmarks/harness_overhead.py's functions, on CUDA tensors), 40 s;
4. pinned host<->GPU copies (labutils.measure.copies) against the PCIe wire rate of the generation and
   width NVML reports (labutils.readers.topology.nvml_facts, else nvidia-smi), rate from
   labutils.readers.links.pcie_figure scaled by width / 16; the CUDA-event timer is checked against a
   synchronised host clock on the same copy (within 15 %), 30 s;
5. notebooks 09 and 10 in full mode, first, each alone (`python -m labutils run-notebooks --only
   <name>`), each under half of the step's 150 s;
6. the other notebooks (00 to 08, and 11) in full mode, each alone, in course order, each under
   NOTEBOOK_LIMIT_S (75 s) while the step's 155 s last.

Step k must end by the sum of the limits of the steps up to k (scaled down when `--budget-s` is
smaller than the plan), so the time a step leaves unused goes to the steps after it and no step
takes time planned for a later one. Each step runs in a process of its own; a step, or a
notebook, that overruns is stopped with every process it started and reported TIMEOUT with its
seconds, and the steps and notebooks after it still run while their time lasts. Each notebook is
printed with its seconds, its key figures (from the runner's summary.json) and PASS / FAIL
against the 60 s target; out/gpu_check/notebooks/<name>/ holds its executed copy and index.html,
out/gpu_check/notebooks/summary.json all of them. The summary table and the targets come last.
Targets, printed PASS / FAIL (NOT RECORDED when a notebook did not record the figure, NOT
MEASURED when nothing measured it; never asserted by a unit test):

- every notebook under 60 s in full mode; their seconds adding up to under 180 s on a 16-core,
  1-GPU machine;
- the median T2 prediction error of the split-layer notebook (09) under 20 % (figure
  `t2_median_error_pct`, else its older name `tp_prediction_error`): the after-the-fact view, eta
  from the split run itself, so only S and l + V/B are predicted (the notebook's a-priori error,
  from runs made before the split, is `t2_apriori_median_error_pct`, reported in the summary);
- the measured DDP step (10) between its no-overlap and ideal-overlap estimates for at least 3 of 4
  sizes (figure `ddp_between_estimates`, a "k/n" string);
- H2D at least 80 % of the PCIe wire rate;
- harness / bare gloo-on-CUDA busbw at least 0.95 from 1 MiB up.

Exit status: 0 when every step that ran passed and no target failed, 1 otherwise, 2 on bad
input; 0 with one line on a machine with neither a GPU nor nvidia-smi (nothing to check).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BUDGET_S = 480.0  # 8 minutes, the whole check
OWN_S = 5.0  # this script's own start and summary, outside every step's limit
RUN_TARGET_S = 180.0
NOTEBOOK_TARGET_S = 60.0
NOTEBOOK_LIMIT_S = 75.0  # one notebook of step 6: the 60 s target, the runner's start and a margin
MIN_LIMIT_S = 10.0  # less than this left: the step (or notebook) is skipped, not started
CHILD_MARGIN_S = 3.0  # a step's process ends this long before its limit (the parent stops it at the limit)
STOP_S = 4.0  # kept free at the end of a notebooks step to stop an overrunning notebook
T2_ERROR_TARGET_PCT = 20.0
DDP_BETWEEN_TARGET = 3 / 4
H2D_TARGET = 0.80
GLOO_RATIO_TARGET = 0.95
COPY_BYTES = 256 << 20
NOTEBOOK_DIR = ROOT / "notebooks"
FIRST_NOTEBOOKS = ("09", "10")  # run first: the ones that have not been seen to finish on a GPU
RUNNER = ("-m", "labutils", "run-notebooks")  # after sys.executable (tests put a fake runner here)
NOTEBOOK_PACKAGES = ("torch", "pandas", "matplotlib", "ipywidgets", "nbformat", "nbconvert", "papermill",
                     "ipykernel", "jupyter_client", "tqdm")


@dataclass(frozen=True)
class Step:
    number: int
    title: str
    timeout_s: float
    packages: tuple[str, ...]


STEPS = {
    1: Step(1, "CUDA-only tests (pytest -m cuda)", 60, ("torch", "pytest")),
    2: Step(2, "NCCL with one rank", 40, ("torch", "pandas")),
    3: Step(3, "gloo on CUDA: harness vs bare all_reduce", 40, ("torch", "pandas")),
    4: Step(4, "host<->GPU copies vs the PCIe wire", 30, ("torch", "pandas")),
    5: Step(5, "notebooks 09 and 10, each alone", 150, NOTEBOOK_PACKAGES),
    6: Step(6, "the other notebooks, each alone", 155, NOTEBOOK_PACKAGES),
}
OPTIONAL = {4: ("pynvml", "nvidia-ml-py: the PCIe generation and width come from nvidia-smi instead")}


def schedule(numbers, budget_s: float) -> list[tuple[Step, float, float]]:
    """(step, limit_s, ends_by_s) for the chosen steps: limit_s = timeout_s x scale, with scale =
    min(1, (budget_s - OWN_S) / sum of the chosen timeout_s); ends_by_s is the running sum of the
    limits, seconds after the check started, by which the step must have ended."""
    steps = [STEPS[n] for n in numbers]
    scale = min(1.0, max(0.0, budget_s - OWN_S) / sum(s.timeout_s for s in steps))
    plan, ends_by = [], 0.0
    for step in steps:
        ends_by += step.timeout_s * scale
        plan.append((step, step.timeout_s * scale, ends_by))
    return plan


def notebook_order(directory=NOTEBOOK_DIR) -> tuple[list[str], list[str]]:
    """(step 5's notebooks, step 6's): those starting with 09 or 10, in that order, then the rest
    in file-name order (the runner's course order)."""
    stems = sorted(p.stem for p in Path(directory).glob("*.ipynb"))
    first = [s for prefix in FIRST_NOTEBOOKS for s in stems if s.startswith(prefix)]
    return first, [s for s in stems if s not in first]


# --- what is importable ------------------------------------------------------------------------

def missing_packages(names, find_spec=importlib.util.find_spec) -> list[str]:
    """The module names in `names` that cannot be imported here (PYTHONPATH included)."""
    missing = []
    for name in names:
        try:
            found = find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def skip_sentence(step: Step, missing: list[str]) -> str:
    return (f"step {step.number} skipped: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not importable "
            "here (this check installs nothing; install them, or put a folder holding them on PYTHONPATH)")


# --- running a step in a process of its own --------------------------------------------------

@dataclass
class StepRun:
    """How one step went: status "PASS", "FAIL", "SKIP" or "TIMEOUT", its seconds, one line of
    detail and the facts it measured (for the targets)."""

    step: Step
    status: str
    seconds: float = 0.0
    detail: str = ""
    facts: dict = field(default_factory=dict)


def _marked_pids(marker: str) -> list[int]:
    """Processes whose environment holds `marker` in LAB_GPU_CHECK (a comma-separated list: a
    notebook's runner carries its step's marker and its own): only what this check started."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            for var in (entry / "environ").read_bytes().split(b"\0"):
                if var.startswith(b"LAB_GPU_CHECK=") and marker.encode() in var[14:].split(b","):
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def stop_marked(marker: str, grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL, every process this check started under `marker`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _marked_pids(marker)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        end = time.monotonic() + grace_s
        while pids and time.monotonic() < end:
            time.sleep(0.1)
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
        if not pids:
            return


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def run_command(cmd: list[str], timeout_s: float, env: dict | None = None,
                log: Path | None = None) -> tuple[int | None, float]:
    """Run `cmd` for at most `timeout_s` (its output goes straight through, or to the file `log`);
    return (exit status, or None when it overran and was stopped with everything it started, seconds)."""
    env = dict(os.environ if env is None else env)
    marker = uuid.uuid4().hex
    env["LAB_GPU_CHECK"] = ",".join(filter(None, (env.get("LAB_GPU_CHECK"), marker)))
    started = time.monotonic()
    with open(log, "w") if log else contextlib.nullcontext() as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stdout=sink,
                                stderr=subprocess.STDOUT if log else None)
        try:
            rc = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            rc = None
        except BaseException:
            stop_marked(marker)
            raise
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except OSError:
                    pass
            stop_marked(marker)
            proc.wait()
    return rc, time.monotonic() - started


def run_step(step: Step, args, limit_s: float, python: str = sys.executable) -> StepRun:
    """Run `step` in a child process (`--step N`) for at most `limit_s`: the child bounds itself
    to CHILD_MARGIN_S less, and is stopped at `limit_s` if it does not."""
    missing = missing_packages(step.packages)
    if missing:
        return StepRun(step, "SKIP", detail=skip_sentence(step, missing))
    if limit_s < MIN_LIMIT_S:
        return StepRun(step, "SKIP", detail=f"step {step.number} skipped: {max(0.0, limit_s):.0f} s of the budget left")
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [python, str(Path(__file__).resolve()), "--step", str(step.number), "--device", args.device,
               "--result-file", str(result_file), "--out", str(args.out)]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--notebooks", str(args.notebooks)] if args.notebooks else []
        cmd += ["--step-timeout-s", f"{limit_s - CHILD_MARGIN_S:.1f}"]
        rc, seconds = run_command(cmd, limit_s)
        facts = json.loads(result_file.read_text()) if result_file.exists() else {}
    if rc is None:
        return StepRun(step, "TIMEOUT", seconds, f"stopped after {limit_s:.0f} s", facts)
    status = facts.pop("status", "PASS" if rc == 0 else "FAIL")
    detail = facts.pop("detail", "" if rc == 0 else f"exit status {rc}")
    return StepRun(step, status, seconds, detail, facts)


def _left_s(args) -> float:
    """Seconds the step running in this process has left (its deadline is set by run_child)."""
    return args.deadline - time.monotonic()


# --- the steps (each runs in the child) ---------------------------------------------------------

def step_tests(args) -> dict:
    """1. every test that needs a GPU: `pytest -m cuda`."""
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
           str(ROOT / "tests")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, _left_s(args)))
    tail = [line for line in proc.stdout.strip().splitlines() if line.strip()]
    last = tail[-1].strip("= ") if tail else "no output"
    print(f"  pytest -m cuda: {last}")
    if proc.returncode == 5:
        return {"status": "PASS", "detail": "no CUDA-only test collected"}
    if proc.returncode != 0:
        print("\n".join(tail[-15:]))
        return {"status": "FAIL", "detail": last}
    skipped_all = "passed" not in last
    return {"status": "FAIL" if args.device == "cuda" and skipped_all else "PASS", "detail": last}


def step_nccl(args) -> dict:
    """2. NCCL with one rank on the GPU (gloo with one CPU rank for --device cpu): a ping, then a
    short sweep whose elements must all be right."""
    from labutils.measure.launch import ping_worker
    from labutils.measure.pool import launch
    from labutils.measure.sweep import run_sweep

    backend = "nccl" if args.device == "cuda" else "gloo"
    ping = launch(ping_worker, 1, backend=backend, device=args.device, timeout_s=max(5.0, _left_s(args) - 1))[0]
    print(f"  {backend} ping, 1 rank on {args.device}: sum {ping['sum']:g} (expected {ping['expected']:g})")
    result = run_sweep(nproc=1, backend=backend, device=args.device, min_bytes="1K",
                       max_bytes="1M" if args.quick else "64M", factor=8, budget_ms=10 if args.quick else 30,
                       progress=False, raise_on_wrong=False, timeout_s=max(5.0, _left_s(args) - 1))
    frame = result.frame
    shown = ", ".join(f"{s >> 10} KiB {a:.2f}" for s, a in zip(frame["size_bytes"], frame["algbw_GBps"]))
    print(f"  1-rank sweep algbw GB/s (busbw is 0 with one rank): {shown}")
    ok = ping["sum"] == ping["expected"] and result.wrong == 0
    detail = f"{backend} 1 rank: ping ok, {len(frame)} sizes, {result.wrong} wrong element(s)"
    gpus = _machine()["gpu_count"] if args.device == "cuda" else 0
    if gpus >= 2:  # several GPUs: NCCL across all of them as well (no target, the figures are printed)
        many = run_sweep(nproc=gpus, backend="nccl", device="cuda", min_bytes="1K", max_bytes="64M", factor=8,
                         budget_ms=30, progress=False, raise_on_wrong=False,
                         timeout_s=max(5.0, _left_s(args) - 1))
        shown = ", ".join(f"{s >> 10} KiB {b:.1f}" for s, b in zip(many.frame["size_bytes"], many.frame["busbw_GBps"]))
        print(f"  NCCL on {gpus} GPUs, busbw GB/s: {shown}")
        ok = ok and many.wrong == 0
        detail += f"; {gpus} GPUs: peak busbw {many.peak_busbw_GBps:.1f} GB/s, {many.wrong} wrong"
    return {"status": "PASS" if ok else "FAIL", "detail": detail, "wrong": int(result.wrong)}


def step_gloo(args) -> dict:
    """3. gloo on CUDA tensors (CPU tensors for --device cpu), 2 ranks: harness vs bare loop."""
    from harness_overhead import RATIO_FROM_BYTES, format_comparison, harness_vs_bare, min_ratio

    quick = args.quick
    rows = harness_vs_bare(args.device, "gloo", 2, "1K", "1M" if quick else "64M", factor=32 if quick else 4,
                           budget_ms=20 if quick else 100, rounds=3 if quick else 5,
                           timeout_s=max(5.0, _left_s(args) - 1))
    print("\n".join("  " + line for line in format_comparison(rows).splitlines()))
    worst = min_ratio(rows, RATIO_FROM_BYTES)
    return {"status": "PASS", "detail": f"min harness/bare busbw ratio from 1 MiB: {worst:.3f}",
            "gloo_ratio_min": None if math.isnan(worst) else worst, "gloo_device": args.device,
            "gloo_peak_busbw_GBps": max(r["busbw_GBps"] for r in rows)}


def pcie_link() -> tuple[int | None, int | None, str]:
    """(generation, width, where read) of GPU 0's link at its best: NVML's maximum (the
    current value drops when the GPU idles), else `nvidia-smi --query-gpu`."""
    try:
        from labutils.readers.topology import nvml_facts

        facts, why = nvml_facts()
    except Exception as exc:  # noqa: BLE001 - a broken driver: try nvidia-smi
        facts, why = [], str(exc)
    if facts:
        f = facts[0]
        return f.pcie_gen_max or f.pcie_gen, f.pcie_width_max or f.pcie_width, "NVML"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=pcie.link.gen.max,pcie.link.width.max",
                                  "--format=csv,noheader,nounits", "-i", "0"], capture_output=True, text=True,
                                 timeout=20).stdout.strip().split(",")
            return int(out[0]), int(out[1]), f"nvidia-smi ({why})"
        except (ValueError, IndexError, OSError, subprocess.TimeoutExpired):
            pass
    return None, None, why or "neither NVML nor nvidia-smi answered"


def wire_rate_GBps(gen: int | None, width: int | None) -> float | None:
    """Per-direction PCIe rate: the link table's x16 specification (links.pcie_figure) x width / 16."""
    from labutils.readers.links import pcie_figure

    if gen not in (3, 4, 5) or not width:
        return None
    return pcie_figure(gen).high_GBps * width / 16


def step_copies(args) -> dict:
    """4. pinned H2D / D2H against the wire's rate (a host memory copy for --device cpu)."""
    from labutils.measure.copies import h2d_d2h, host_copy

    size = (16 << 20) if args.quick else COPY_BYTES
    if args.device != "cuda":
        r = host_copy(size, iters=5)
        print(f"  host copy {size >> 20} MiB: {r.GBps:.1f} GB/s (no GPU: no wire to compare with)")
        return {"status": "PASS", "detail": f"host copy {r.GBps:.1f} GB/s"}
    h2d, d2h = h2d_d2h(0, size, iters=20)
    events_ms, clock_ms = timer_agreement(size)
    agree = abs(events_ms / clock_ms - 1) < 0.15
    print(f"  timer: H2D copy {events_ms:.3f} ms by CUDA events, {clock_ms:.3f} ms by a synchronised host clock"
          + ("" if agree else " (they disagree by more than 15%: copy figures are not trustworthy)"))
    gen, width, source = pcie_link()
    wire = wire_rate_GBps(gen, width)
    line = f"  H2D {h2d.GBps:.1f} GB/s, D2H {d2h.GBps:.1f} GB/s ({size >> 20} MiB, pinned)"
    if wire:
        print(f"{line}; PCIe gen {gen} x{width} from {source}: wire {wire:.1f} GB/s per direction, "
              f"H2D {h2d.GBps / wire:.0%}, D2H {d2h.GBps / wire:.0%} of it")
    else:
        print(f"{line}; the wire's rate is unknown: {source}")
    return {"status": "PASS" if agree else "FAIL",
            "detail": f"H2D {h2d.GBps:.1f} GB/s" + (f" = {h2d.GBps / wire:.0%} of gen {gen} x{width}" if wire
                                                    else ", wire rate unknown")
                      + ("" if agree else "; timers disagree"),
            "h2d_GBps": h2d.GBps, "d2h_GBps": d2h.GBps, "wire_GBps": wire,
            "h2d_fraction": h2d.GBps / wire if wire else None}


def timer_agreement(size_bytes: int, iters: int = 10) -> tuple[float, float]:
    """ms per pinned H2D copy of GPU 0 timed by CUDA events (labutils.measure.timing.time_loop) and by
    perf_counter around a synchronised loop: the two must agree for any GPU figure to hold."""
    import torch

    from labutils.measure.timing import time_loop

    host = torch.ones(size_bytes, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(size_bytes, dtype=torch.uint8, device="cuda:0")
    copy = lambda: gpu.copy_(host, non_blocking=True)  # noqa: E731
    copy()
    events_ms = time_loop(copy, iters, "cuda:0", sync_ranks=False)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        copy()
    torch.cuda.synchronize()
    return events_ms, (time.perf_counter() - started) / iters * 1e3


def run_notebook(stem: str, limit_s: float, args) -> dict:
    """Execute one notebook alone (`run-notebooks --only <stem>`, full mode unless --quick) into
    <out>/notebooks/<stem>/ for at most `limit_s`; its result files go to <out>/results, shared by
    all notebooks. Returns its status (PASS: ran and took at most NOTEBOOK_TARGET_S; FAIL;
    TIMEOUT: stopped at `limit_s`), seconds (the runner's, or the wall time when stopped), wall_s,
    figures, units and error (the runner's summary.json entry)."""
    out = Path(args.out) / "notebooks" / stem
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    cmd = [sys.executable, *RUNNER, "--only", stem, "--out", str(out),
           "--notebooks", str(args.notebooks or NOTEBOOK_DIR)] + (["--quick"] if args.quick else [])
    env = {**os.environ, "LAB_RESULTS_DIR": str(Path(args.out) / "results")}
    rc, wall = run_command(cmd, limit_s, env, log=out / "run.log")
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    nb = summary.get("notebooks", {}).get(stem)
    run = {"ok": False, "seconds": round(wall, 2), "wall_s": round(wall, 2), "figures": {}, "units": {}, "error": ""}
    if rc is None:
        return {**run, "status": "TIMEOUT", "error": f"stopped at its limit, {limit_s:.0f} s"}
    if nb is None:
        return {**run, "status": "FAIL", "error": f"no summary.json (exit status {rc}; see {out / 'run.log'})"}
    run.update({k: nb[k] for k in ("ok", "seconds", "figures", "units") if k in nb}, error=nb.get("error") or "")
    if not run["ok"]:
        run["error"] = f"{nb.get('failed_stage') or 'execute'}: {run['error']}"
    elif run["seconds"] > NOTEBOOK_TARGET_S:
        run["error"] = f"over the {NOTEBOOK_TARGET_S:.0f} s target"
    return {**run, "status": "PASS" if run["ok"] and run["seconds"] <= NOTEBOOK_TARGET_S else "FAIL"}


def run_notebooks_alone(stems: list[str], args, limit_for) -> dict:
    """Run `stems` one after the other, each alone for at most `limit_for(index, seconds left)`
    seconds, printing each as it ends; a notebook with less than MIN_LIMIT_S is not started
    (SKIP). The step's facts: status (PASS when every notebook passed), detail and summary (the
    runner's summary.json shape, with each notebook's status)."""
    if not stems:
        return {"status": "SKIP", "detail": f"no such notebook in {args.notebooks or NOTEBOOK_DIR}"}
    runs = {}
    for index, stem in enumerate(stems):
        left = _left_s(args) - STOP_S
        limit = min(limit_for(index, left), left)
        if limit < MIN_LIMIT_S:
            runs[stem] = {"status": "SKIP", "ok": False, "seconds": 0.0, "figures": {}, "units": {},
                          "error": f"not run: {max(0.0, left):.0f} s of the step left"}
        else:
            runs[stem] = run_notebook(stem, limit, args)
        print(format_notebooks({"notebooks": {stem: runs[stem]}}), flush=True)
    counts = {s: sum(r["status"] == s for r in runs.values()) for s in ("PASS", "FAIL", "TIMEOUT", "SKIP")}
    detail = (f"{counts['PASS']}/{len(runs)} PASS in {sum(r['seconds'] for r in runs.values()):.0f} s"
              + "".join(f", {n} {s}" for s, n in counts.items() if n and s != "PASS"))
    return {"status": "PASS" if counts["PASS"] == len(runs) else "FAIL", "detail": detail,
            "summary": {"quick": bool(args.quick), "notebooks": runs}}


def step_first_notebooks(args) -> dict:
    """5. notebooks 09 and 10, each alone, each under its share of the step: the k-th of n must end
    by k/n of the step's time (so 10 gets what 09 left unused)."""
    stems = notebook_order(args.notebooks or NOTEBOOK_DIR)[0]
    end = _left_s(args) - STOP_S
    return run_notebooks_alone(stems, args, lambda i, left: left - end * (len(stems) - 1 - i) / len(stems))


def step_other_notebooks(args) -> dict:
    """6. the other notebooks in course order, each alone, each under NOTEBOOK_LIMIT_S while the step lasts."""
    stems = notebook_order(args.notebooks or NOTEBOOK_DIR)[1]
    return run_notebooks_alone(stems, args, lambda i, left: NOTEBOOK_LIMIT_S)


def format_notebooks(summary: dict) -> str:
    """One line per notebook: PASS / FAIL / TIMEOUT / SKIP, seconds, its key figures, why it failed."""
    lines = []
    for name, nb in summary.get("notebooks", {}).items():
        figs = ", ".join(f"{k}={_short(v)}{(' ' + nb.get('units', {}).get(k, '')).rstrip()}"
                         for k, v in nb.get("figures", {}).items())
        status = nb.get("status") or ("PASS" if nb.get("ok") else "FAIL")
        why = f"  ({nb.get('error', '')[:100]})" if status != "PASS" and nb.get("error") else ""
        lines.append(f"  {name:28} {status:<7} {nb.get('seconds', 0):6.1f} s" + (f"  {figs}" if figs else "") + why)
    return "\n".join(lines)


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


STEP_FUNCTIONS = {1: step_tests, 2: step_nccl, 3: step_gloo, 4: step_copies, 5: step_first_notebooks,
                  6: step_other_notebooks}


# --- the targets (a pure function of what the steps measured) ----------------------------------

@dataclass(frozen=True)
class Target:
    name: str
    status: str  # PASS, FAIL, NOT RECORDED, NOT MEASURED
    detail: str


def find_figure(summary: dict | None, *keys: str):
    """(notebook, key, value) of the first of `keys` any notebook recorded, else None."""
    for key in keys:
        for name, nb in (summary or {}).get("notebooks", {}).items():
            if nb.get("figures", {}).get(key) is not None:
                return name, key, nb["figures"][key]
    return None


def parse_fraction(text) -> tuple[int, int] | None:
    """"3/4" -> (3, 4); None when it is not k/n with 0 <= k <= n, n >= 1."""
    try:
        k, n = (int(part) for part in str(text).split("/"))
    except ValueError:
        return None
    return (k, n) if n >= 1 and 0 <= k <= n else None


def evaluate_targets(facts: dict) -> list[Target]:
    """PASS / FAIL per target from the facts the steps gathered: summary (the notebooks' runs, in
    the runner's summary.json shape with each notebook's status and seconds), h2d_fraction,
    gloo_ratio_min, gloo_device, cpu_cores, gpu_count. A figure nobody recorded is NOT RECORDED,
    one that nothing measured NOT MEASURED (a notebook not run, SKIP, leaves the time targets
    NOT MEASURED unless those that ran already miss them)."""
    out = []
    summary = facts.get("summary")
    machine = f"this machine: {facts.get('cpu_cores', '?')} cores, {facts.get('gpu_count', '?')} GPU(s)"
    ran = {n: v for n, v in (summary or {}).get("notebooks", {}).items() if v.get("status", "PASS") != "SKIP"}
    not_run = sorted(set((summary or {}).get("notebooks", {})) - set(ran))
    unrun = f"; not run: {', '.join(not_run)}" if not_run else ""
    total_name = f"the notebooks' seconds add up to under {RUN_TARGET_S:.0f} s (16 cores, 1 GPU)"
    each_name = f"every notebook under {NOTEBOOK_TARGET_S:.0f} s"
    if not ran:
        out.append(Target(total_name, "NOT MEASURED", "no notebook ran"))
        out.append(Target(each_name, "NOT MEASURED", "no notebook ran"))
    else:
        mode = " (quick mode: the targets are for full mode)" if (summary or {}).get("quick") else ""
        total = sum(v.get("seconds", 0.0) for v in ran.values())
        out.append(Target(total_name, "FAIL" if total >= RUN_TARGET_S else "NOT MEASURED" if not_run else "PASS",
                          f"{total:.0f} s over {len(ran)} notebook(s){unrun}; {machine}{mode}"))
        over = {n: v for n, v in ran.items()
                if v.get("status") == "TIMEOUT" or v.get("seconds", 0.0) > NOTEBOOK_TARGET_S}
        slowest = max(ran, key=lambda n: ran[n].get("seconds", 0.0))
        shown = ", ".join(f"{n} {v.get('seconds', 0.0):.1f} s" + (" (TIMEOUT)" if v.get("status") == "TIMEOUT" else "")
                          for n, v in over.items())
        out.append(Target(each_name, "FAIL" if over else "NOT MEASURED" if not_run else "PASS",
                          f"over: {shown}" if over else f"slowest {slowest} {ran[slowest].get('seconds', 0.0):.1f} s"
                          + unrun + mode))
    err = find_figure(summary, "t2_median_error_pct", "tp_prediction_error")
    if not ran:
        out.append(Target(f"median T2 error under {T2_ERROR_TARGET_PCT:.0f}%", "NOT MEASURED", "no notebook ran"))
    elif err is None:
        out.append(Target(f"median T2 error under {T2_ERROR_TARGET_PCT:.0f}%", "NOT RECORDED",
                          "no notebook recorded t2_median_error_pct"))
    else:
        out.append(Target(f"median T2 error under {T2_ERROR_TARGET_PCT:.0f}%",
                          "PASS" if float(err[2]) < T2_ERROR_TARGET_PCT else "FAIL",
                          f"{float(err[2]):.1f}% ({err[0]}: {err[1]})"))
    between = find_figure(summary, "ddp_between_estimates")
    name = "DDP step between its two estimates for at least 3 of 4 sizes"
    if not ran:
        out.append(Target(name, "NOT MEASURED", "no notebook ran"))
    elif between is None:
        out.append(Target(name, "NOT RECORDED", "no notebook recorded ddp_between_estimates"))
    else:
        frac = parse_fraction(between[2])
        out.append(Target(name, "FAIL" if frac is None or frac[0] < DDP_BETWEEN_TARGET * frac[1] else "PASS",
                          f"{between[2]} ({between[0]})" if frac else f"unreadable value {between[2]!r}"))
    h2d = facts.get("h2d_fraction")
    out.append(Target(f"H2D at least {H2D_TARGET:.0%} of the PCIe wire rate",
                      "NOT MEASURED" if h2d is None else "PASS" if h2d >= H2D_TARGET else "FAIL",
                      "no GPU copy or no wire rate" if h2d is None else f"{h2d:.0%}"))
    ratio = facts.get("gloo_ratio_min")
    on = facts.get("gloo_device", "cuda")
    out.append(Target(f"harness/bare gloo-on-{'CUDA' if on == 'cuda' else on} busbw at least {GLOO_RATIO_TARGET} "
                      "from 1 MiB", "NOT MEASURED" if ratio is None else "PASS" if ratio >= GLOO_RATIO_TARGET
                      else "FAIL", "step 3 did not measure it" if ratio is None else f"min {ratio:.3f}"))
    return out


def format_report(runs: list[StepRun], targets: list[Target]) -> str:
    """The closing summary: one row per step, then one line per target."""
    lines = ["", "== summary", f"{'step':<46} {'status':<8} {'seconds':>7}  detail"]
    lines += [f"{f'{r.step.number}. {r.step.title}':<46} {r.status:<8} {r.seconds:>7.1f}  {r.detail}" for r in runs]
    lines += ["", "== targets"]
    lines += [f"{t.status:<12} {t.name}: {t.detail}" for t in targets]
    return "\n".join(lines)


# --- the command line ---------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):  # bad input: one line, exit status 2
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv=None):
    p = _Parser(prog="benchmarks/gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="cuda: the GPU checks; cpu: the same steps on CPU tensors (gloo); "
                        "auto: cuda when a GPU is seen")
    p.add_argument("--steps", default="1,2,3,4,5,6", help="which steps, e.g. 3,4 or 5 (default: all six)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the missing packages; run nothing")
    p.add_argument("--quick", action="store_true", help="small sizes and quick-mode notebooks (to try the script)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S,
                   help="seconds for the whole check, every step included (default 480)")
    p.add_argument("--out", default=str(ROOT / "out" / "gpu_check"),
                   help="folder for the executed notebooks, their index.html and result files (default: out/gpu_check)")
    p.add_argument("--notebooks", default=None, help=argparse.SUPPRESS)
    p.add_argument("--step", type=int, default=None, help=argparse.SUPPRESS)  # run one step here
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--step-timeout-s", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.steps = sorted({int(s) for s in args.steps.split(",") if s.strip()})
    except ValueError:
        p.error(f"--steps {args.steps!r} must be step numbers 1-6, e.g. 3,4")
    if not args.steps or any(s not in STEPS for s in args.steps):
        p.error(f"--steps {','.join(map(str, args.steps))} is outside the steps 1-6")
    if not (args.budget_s > 0):
        p.error(f"--budget-s={args.budget_s!r} is outside the allowed range (0, inf) s")
    if args.step is not None and args.step not in STEPS:
        p.error(f"--step={args.step} is outside the steps 1-6")
    return args


def _machine() -> dict:
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    return {"cpu_cores": os.cpu_count() or 1, "gpu_count": gpus, "nvidia_smi": shutil.which("nvidia-smi")}


def placement_line() -> str:
    """Where 2 ranks' threads would run (labutils.measure.placement), in one line."""
    try:
        from labutils.measure.placement import machine_placement

        return f"CPU placement for 2 ranks: {machine_placement(2).explanation}"
    except Exception as exc:  # noqa: BLE001 - a bad LAB_THREADS_PER_RANK, say, is reported, not fatal here
        return f"CPU placement: {exc}"


def run_child(args) -> int:
    """`--step N`: run one step in this process, within --step-timeout-s, and write its facts to --result-file."""
    args.step_timeout_s = args.step_timeout_s or STEPS[args.step].timeout_s
    args.deadline = time.monotonic() + args.step_timeout_s
    try:
        facts = STEP_FUNCTIONS[args.step](args)
    except Exception as exc:  # noqa: BLE001 - reported as the step's failure
        facts = {"status": "FAIL", "detail": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        print(f"  {facts['detail']}")
    if args.result_file:
        from labutils.core.results import to_json

        Path(args.result_file).write_text(to_json(facts))
    return 0 if facts.get("status") in ("PASS", "SKIP") else 1


def merge_facts(facts: dict, new: dict) -> None:
    """Add a step's facts to `facts`; the notebooks of steps 5 and 6 join one summary."""
    new = dict(new)
    summary = new.pop("summary", None)
    facts.update(new)
    if summary is not None:
        merged = facts.setdefault("summary", {"quick": summary.get("quick", False), "notebooks": {}})
        merged["notebooks"].update(summary.get("notebooks", {}))


def format_plan(plan, budget_s: float, directory=NOTEBOOK_DIR, notes: dict | None = None, quick=False) -> str:
    """The dry run's plan: each step with its limit, when it must have ended and its note (which
    packages are missing), and the notebooks' order."""
    first, rest = notebook_order(directory)
    mode = "quick mode" if quick else "full mode"
    lines = [f"plan: budget {budget_s:.0f} s, the step limits add up to {sum(p[1] for p in plan):.0f} s "
             "(time a step leaves unused goes to the steps after it)"]
    for step, limit, ends_by in plan:
        note = (notes or {}).get(step.number)
        lines.append(f"  {step.number}. {step.title}: up to {limit:.0f} s, ends by {ends_by:.0f} s"
                     + (f"; {note}" if note else ""))
        if step.number == 5:
            share = (limit - CHILD_MARGIN_S - STOP_S) / max(1, len(first))
            lines.append(f"     {mode}, in order: {', then '.join(first) or 'none found'}; each up to {share:.0f} s")
        elif step.number == 6:
            lines.append(f"     {mode}, in order: {', '.join(rest) or 'none found'}; "
                         f"each up to {NOTEBOOK_LIMIT_S:.0f} s while the step has time")
    return "\n".join(lines)


def main(argv=None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    if args.step is not None and args.device != "auto":  # a step's own process: no torch import unless it needs one
        return run_child(args)
    machine = _machine()
    if args.device == "auto":
        if machine["gpu_count"] == 0 and not machine["nvidia_smi"]:
            print("gpu_check: no CUDA GPU and no nvidia-smi here: nothing to check (--device cpu runs the steps "
                  "on the CPU)" + ("; the plan on a GPU machine:" if args.dry_run else ""))
            if not args.dry_run:
                return 0
        args.device = "cuda"
    if args.step is not None:
        return run_child(args)
    print(f"gpu_check on {machine['cpu_cores']} cores, {machine['gpu_count']} GPU(s), device {args.device}, "
          f"budget {args.budget_s:.0f} s" + (", quick" if args.quick else ""))
    print(placement_line())
    if args.device == "cuda" and machine["gpu_count"] == 0 and not args.dry_run:
        print("FAIL: nvidia-smi is here but torch sees no CUDA GPU (a CPU build of torch, or a driver mismatch)")
        return 1
    plan = schedule(args.steps, args.budget_s)
    notes = {}
    for step, _, _ in plan:
        missing = missing_packages(step.packages)
        optional = [f"{name} missing ({why})" for name, why in [OPTIONAL.get(step.number, (None, None))]
                    if name and missing_packages([name])]
        notes[step.number] = ((skip_sentence(step, missing) if missing else "all packages importable")
                              + (f"; {optional[0]}" if optional else ""))
        if optional and not args.dry_run:
            print(f"  note: {optional[0]}")
    if args.dry_run:
        print(format_plan(plan, args.budget_s, args.notebooks or NOTEBOOK_DIR, notes, args.quick))
        return 0
    args.out = Path(args.out).resolve()
    runs, facts = [], dict(machine)
    try:
        for step, _, ends_by in plan:
            print(f"\n== {step.number}. {step.title}", flush=True)
            run = run_step(step, args, started + ends_by - time.monotonic())
            if run.status == "SKIP":
                print(f"  {run.detail}")
            merge_facts(facts, run.facts)
            runs.append(run)
    except KeyboardInterrupt:
        print(format_report(runs, evaluate_targets(facts)))
        print("interrupted: the steps above ran, every process this check started was stopped")
        return 130
    targets = evaluate_targets(facts)
    print(format_report(runs, targets))
    if "summary" in facts:
        from labutils.core.results import to_json

        merged = args.out / "notebooks" / "summary.json"
        merged.parent.mkdir(parents=True, exist_ok=True)
        merged.write_text(to_json(facts["summary"]) + "\n")
        print(f"\nexecuted notebooks: {args.out / 'notebooks'}/<name>/index.html; all of them in {merged}")
    bad = any(r.status in ("FAIL", "TIMEOUT") for r in runs) or any(t.status == "FAIL" for t in targets)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
