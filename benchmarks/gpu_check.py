"""The device check: one script, about 8 minutes on a 1-GPU, 16-core machine without network.

    python benchmarks/gpu_check.py                # from the repository root, on the GPU machine
    python benchmarks/gpu_check.py --dry-run      # what it would run, and which packages are missing
    python benchmarks/gpu_check.py --device cpu   # the same steps on the CPU (gloo instead of NCCL)

It installs nothing: it uses what is importable and names any missing package (a step whose
packages are missing is skipped with that sentence; a folder on PYTHONPATH counts). In order:

1. the CUDA-only tests (`pytest -m cuda`: every test that needs a GPU, see tests/conftest.py);
2. NCCL with one rank on the GPU: a ping (all-reduce of the rank number) and a short sweep
   (with several GPUs, also a sweep across all of them);
3. gloo on CUDA tensors, 2 ranks sharing the GPU: the harness against a bare `dist.all_reduce`
   loop (benchmarks/harness_overhead.py's functions, on CUDA tensors);
4. pinned host<->GPU copies (labutils.measure.copies) against the PCIe wire rate of the generation and
   width NVML reports (labutils.readers.topology.nvml_facts, else nvidia-smi), rate from
   labutils.readers.links.pcie_figure scaled by width / 16; the CUDA-event timer is checked against a
   synchronised host clock on the same copy (within 15 %);
5. `python -m labutils run-notebooks` in full mode, with each notebook's seconds and key figures
   read from its summary.json.

Each step runs in a process of its own under its own time limit (and the whole under
`--budget-s`); a step that overruns is stopped with every process it started. The summary table
and the targets come last. Targets, printed PASS / FAIL (NOT RECORDED when a notebook did not
record the figure; never asserted by a unit test):

- the full run-notebooks under 180 s on a 16-core, 1-GPU machine, no notebook over 60 s;
- the median T2 prediction error of the split-layer notebook under 20 % (figure
  `t2_median_error_pct`, else its older name `tp_prediction_error`): the after-the-fact view, eta
  from the split run itself, so only S and l + V/B are predicted (the notebook's a-priori error,
  from runs made before the split, is `t2_apriori_median_error_pct`, reported in the summary);
- the measured DDP step between its no-overlap and ideal-overlap bounds for at least 3 of 4 sizes
  (figure `ddp_between_bounds`, a "k/n" string);
- H2D at least 80 % of the PCIe wire rate;
- harness / bare gloo-on-CUDA busbw at least 0.95 from 1 MiB up.

Exit status: 0 when every step that ran passed and no target failed, 1 otherwise, 2 on bad
input; 0 with one line on a machine with neither a GPU nor nvidia-smi (nothing to check).
"""

from __future__ import annotations

import argparse
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
RUN_TARGET_S = 180.0
NOTEBOOK_TARGET_S = 60.0
T2_ERROR_TARGET_PCT = 20.0
DDP_BETWEEN_TARGET = 3 / 4
H2D_TARGET = 0.80
GLOO_RATIO_TARGET = 0.95
COPY_BYTES = 256 << 20


@dataclass(frozen=True)
class Step:
    number: int
    title: str
    timeout_s: float
    packages: tuple[str, ...]


STEPS = {
    1: Step(1, "CUDA-only tests (pytest -m cuda)", 120, ("torch", "pytest")),
    2: Step(2, "NCCL with one rank", 90, ("torch", "pandas")),
    3: Step(3, "gloo on CUDA: harness vs bare all_reduce", 150, ("torch", "pandas")),
    4: Step(4, "host<->GPU copies vs the PCIe wire", 60, ("torch", "pandas")),
    5: Step(5, "run-notebooks, full mode", 300,
            ("torch", "pandas", "matplotlib", "ipywidgets", "nbformat", "nbconvert", "papermill", "ipykernel",
             "jupyter_client", "tqdm")),
}
OPTIONAL = {4: ("pynvml", "nvidia-ml-py: the PCIe generation and width come from nvidia-smi instead")}


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
    """Processes whose environment holds LAB_GPU_CHECK=<marker>: only what this check started."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"LAB_GPU_CHECK={marker}".encode() in (entry / "environ").read_bytes().split(b"\0"):
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


def run_command(cmd: list[str], timeout_s: float, env: dict | None = None) -> tuple[int | None, float]:
    """Run `cmd` (output goes straight through) for at most `timeout_s`; return (exit status, or
    None when it overran and was stopped with everything it started, seconds)."""
    marker = uuid.uuid4().hex
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**(env or os.environ), "LAB_GPU_CHECK": marker},
                            start_new_session=True)
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


def run_step(step: Step, args, budget_left_s: float, python: str = sys.executable) -> StepRun:
    """Run `step` in a child process (`--step N`), within its limit and the budget left."""
    missing = missing_packages(step.packages)
    if missing:
        return StepRun(step, "SKIP", detail=skip_sentence(step, missing))
    limit = min(step.timeout_s, budget_left_s)
    if limit < 10:
        return StepRun(step, "SKIP", detail=f"step {step.number} skipped: {budget_left_s:.0f} s of the budget left")
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [python, str(Path(__file__).resolve()), "--step", str(step.number), "--device", args.device,
               "--result-file", str(result_file), "--out", str(args.out)]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--notebooks", str(args.notebooks)] if args.notebooks else []
        cmd += ["--step-timeout-s", f"{limit:.0f}"]
        rc, seconds = run_command(cmd, limit + 15)  # the child bounds itself; this is the backstop
        facts = json.loads(result_file.read_text()) if result_file.exists() else {}
    if rc is None:
        return StepRun(step, "TIMEOUT", seconds, f"stopped after {limit:.0f} s", facts)
    status = facts.pop("status", "PASS" if rc == 0 else "FAIL")
    detail = facts.pop("detail", "" if rc == 0 else f"exit status {rc}")
    return StepRun(step, status, seconds, detail, facts)


# --- the steps (each runs in the child) ---------------------------------------------------------

def step_tests(args) -> dict:
    """1. every test that needs a GPU: `pytest -m cuda`."""
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
           str(ROOT / "tests")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.step_timeout_s)
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
    ping = launch(ping_worker, 1, backend=backend, device=args.device, timeout_s=min(60, args.step_timeout_s))[0]
    print(f"  {backend} ping, 1 rank on {args.device}: sum {ping['sum']:g} (expected {ping['expected']:g})")
    result = run_sweep(nproc=1, backend=backend, device=args.device, min_bytes="1K",
                       max_bytes="1M" if args.quick else "64M", factor=8, budget_ms=10 if args.quick else 30,
                       progress=False, raise_on_wrong=False, timeout_s=max(10.0, args.step_timeout_s - 20))
    frame = result.frame
    shown = ", ".join(f"{s >> 10} KiB {a:.2f}" for s, a in zip(frame["size_bytes"], frame["algbw_GBps"]))
    print(f"  1-rank sweep algbw GB/s (busbw is 0 with one rank): {shown}")
    ok = ping["sum"] == ping["expected"] and result.wrong == 0
    detail = f"{backend} 1 rank: ping ok, {len(frame)} sizes, {result.wrong} wrong element(s)"
    gpus = _machine()["gpu_count"] if args.device == "cuda" else 0
    if gpus >= 2:  # several GPUs: NCCL across all of them as well (no target, the figures are printed)
        many = run_sweep(nproc=gpus, backend="nccl", device="cuda", min_bytes="1K", max_bytes="64M", factor=8,
                         budget_ms=30, progress=False, raise_on_wrong=False,
                         timeout_s=max(10.0, args.step_timeout_s - 40))
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
                           timeout_s=max(10.0, args.step_timeout_s - 10))
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


def step_notebooks(args) -> dict:
    """5. `run-notebooks` in full mode (quick with --quick): wall time, and per notebook its
    seconds and key figures from summary.json. Near the step's limit the run is interrupted
    (Ctrl-C), so that it still writes summary.json for the notebooks it finished."""
    out = Path(args.out) / "notebooks"
    cmd = [sys.executable, "-m", "labutils", "run-notebooks", "--out", str(out)]
    cmd += ["--quick"] if args.quick else []
    cmd += ["--notebooks", str(args.notebooks)] if args.notebooks else []
    env = {**os.environ, "LAB_RESULTS_DIR": str(Path(args.out) / "results")}
    (out / "summary.json").unlink(missing_ok=True)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text, _ = proc.communicate(timeout=max(5.0, args.step_timeout_s - 20))
        interrupted = False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            text, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        interrupted = True
    wall = time.monotonic() - started
    summary_path = out / "summary.json"
    if not summary_path.exists():
        print("\n".join(text.strip().splitlines()[-20:]))
        return {"status": "FAIL", "detail": f"no summary.json (exit status {proc.returncode})", "run_wall_s": wall}
    summary = json.loads(summary_path.read_text())
    print(format_notebooks(summary))
    failed = [n for n, v in summary["notebooks"].items() if not v["ok"]]
    detail = (f"{len(summary['notebooks']) - len(failed)}/{len(summary['notebooks'])} ok in {wall:.0f} s"
              + (f"; failed: {', '.join(failed)}" if failed else "")
              + (f"; interrupted at the step's limit ({args.step_timeout_s:.0f} s)" if interrupted else ""))
    return {"status": "FAIL" if failed or proc.returncode else "PASS", "detail": detail,
            "run_wall_s": wall, "quick": summary.get("quick", False), "summary": summary}


def format_notebooks(summary: dict) -> str:
    """One line per notebook: status, seconds and its key figures."""
    lines = []
    for name, nb in summary.get("notebooks", {}).items():
        figs = ", ".join(f"{k}={_short(v)}{(' ' + nb.get('units', {}).get(k, '')).rstrip()}"
                         for k, v in nb.get("figures", {}).items())
        status = "ok" if nb.get("ok") else f"FAILED ({nb.get('failed_stage') or 'execute'}: {nb.get('error', '')[:80]})"
        lines.append(f"  {name:28} {nb.get('seconds', 0):6.1f} s  {status}" + (f"  {figs}" if figs else ""))
    return "\n".join(lines)


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


STEP_FUNCTIONS = {1: step_tests, 2: step_nccl, 3: step_gloo, 4: step_copies, 5: step_notebooks}


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
    """PASS / FAIL per target from the facts the steps gathered: run_wall_s, summary (the
    run-notebooks summary.json), quick, h2d_fraction, gloo_ratio_min, gloo_device, cpu_cores,
    gpu_count. A figure nobody recorded is NOT RECORDED, a step that did not run NOT MEASURED."""
    out = []
    summary = facts.get("summary")
    machine = f"this machine: {facts.get('cpu_cores', '?')} cores, {facts.get('gpu_count', '?')} GPU(s)"
    if summary is None:
        out.append(Target(f"full run under {RUN_TARGET_S:.0f} s (16 cores, 1 GPU)", "NOT MEASURED",
                          "step 5 did not run"))
        out.append(Target(f"no notebook over {NOTEBOOK_TARGET_S:.0f} s", "NOT MEASURED", "step 5 did not run"))
    else:
        mode = " (quick mode: the target is for full mode)" if facts.get("quick") else ""
        wall = facts.get("run_wall_s")
        out.append(Target(f"full run under {RUN_TARGET_S:.0f} s (16 cores, 1 GPU)",
                          "PASS" if wall is not None and wall < RUN_TARGET_S else "FAIL",
                          f"{wall:.0f} s; {machine}{mode}" if wall is not None else "no wall time"))
        seconds = {n: v.get("seconds", 0.0) for n, v in summary.get("notebooks", {}).items()}
        slowest = max(seconds, key=seconds.get) if seconds else None
        out.append(Target(f"no notebook over {NOTEBOOK_TARGET_S:.0f} s",
                          "PASS" if slowest and seconds[slowest] <= NOTEBOOK_TARGET_S else "FAIL",
                          f"slowest {slowest} {seconds[slowest]:.1f} s" if slowest else "no notebook ran"))
    err = find_figure(summary, "t2_median_error_pct", "tp_prediction_error")
    if summary is None:
        out.append(Target(f"median T2 error under {T2_ERROR_TARGET_PCT:.0f}%", "NOT MEASURED", "step 5 did not run"))
    elif err is None:
        out.append(Target(f"median T2 error under {T2_ERROR_TARGET_PCT:.0f}%", "NOT RECORDED",
                          "no notebook recorded t2_median_error_pct"))
    else:
        out.append(Target(f"median T2 error under {T2_ERROR_TARGET_PCT:.0f}%",
                          "PASS" if float(err[2]) < T2_ERROR_TARGET_PCT else "FAIL",
                          f"{float(err[2]):.1f}% ({err[0]}: {err[1]})"))
    between = find_figure(summary, "ddp_between_bounds")
    name = "DDP step between its bounds for at least 3 of 4 sizes"
    if summary is None:
        out.append(Target(name, "NOT MEASURED", "step 5 did not run"))
    elif between is None:
        out.append(Target(name, "NOT RECORDED", "no notebook recorded ddp_between_bounds"))
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
    p.add_argument("--steps", default="1,2,3,4,5", help="which steps, e.g. 3,4 (default: all five)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the missing packages; run nothing")
    p.add_argument("--quick", action="store_true", help="small sizes and quick-mode notebooks (to try the script)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds for the whole check (default 480)")
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
        p.error(f"--steps {args.steps!r} must be step numbers 1-5, e.g. 3,4")
    if not args.steps or any(s not in STEPS for s in args.steps):
        p.error(f"--steps {','.join(map(str, args.steps))} is outside the steps 1-5")
    if not (args.budget_s > 0):
        p.error(f"--budget-s={args.budget_s!r} is outside the allowed range (0, inf) s")
    if args.step is not None and args.step not in STEPS:
        p.error(f"--step={args.step} is outside the steps 1-5")
    return args


def _machine() -> dict:
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    return {"cpu_cores": os.cpu_count() or 1, "gpu_count": gpus, "nvidia_smi": shutil.which("nvidia-smi")}


def run_child(args) -> int:
    """`--step N`: run one step in this process and write its facts to --result-file."""
    args.step_timeout_s = args.step_timeout_s or STEPS[args.step].timeout_s
    try:
        facts = STEP_FUNCTIONS[args.step](args)
    except Exception as exc:  # noqa: BLE001 - reported as the step's failure
        facts = {"status": "FAIL", "detail": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        print(f"  {facts['detail']}")
    if args.result_file:
        from labutils.core.results import to_json

        Path(args.result_file).write_text(to_json(facts))
    return 0 if facts.get("status") == "PASS" else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = _machine()
    if args.device == "auto":
        if machine["gpu_count"] == 0 and not machine["nvidia_smi"]:
            print("gpu_check: no CUDA GPU and no nvidia-smi here: nothing to check (--device cpu runs the steps "
                  "on the CPU)")
            return 0
        args.device = "cuda"
    if args.step is not None:
        return run_child(args)
    print(f"gpu_check on {machine['cpu_cores']} cores, {machine['gpu_count']} GPU(s), device {args.device}, "
          f"budget {args.budget_s:.0f} s" + (", quick" if args.quick else ""))
    try:
        from labutils.measure.placement import machine_placement

        print(f"CPU placement for 2 ranks: {machine_placement(2).explanation}")
    except Exception as exc:  # noqa: BLE001 - a bad LAB_THREADS_PER_RANK, say, is reported, not fatal here
        print(f"CPU placement: {exc}")
    if args.device == "cuda" and machine["gpu_count"] == 0:
        print("FAIL: nvidia-smi is here but torch sees no CUDA GPU (a CPU build of torch, or a driver mismatch)")
        return 1
    for number in args.steps:
        step = STEPS[number]
        missing = missing_packages(step.packages)
        optional = [f"{name} missing ({why})" for name, why in [OPTIONAL.get(number, (None, None))]
                    if name and missing_packages([name])]
        if args.dry_run:
            state = skip_sentence(step, missing) if missing else "all packages importable"
            print(f"  {number}. {step.title}: up to {step.timeout_s:.0f} s; {state}"
                  + (f"; {optional[0]}" if optional else ""))
        elif optional:
            print(f"  note: {optional[0]}")
    if args.dry_run:
        return 0
    args.out = Path(args.out).resolve()
    deadline = time.monotonic() + args.budget_s
    runs, facts = [], dict(machine)
    try:
        for number in args.steps:
            step = STEPS[number]
            print(f"\n== {number}. {step.title}", flush=True)
            run = run_step(step, args, deadline - time.monotonic())
            if run.status == "SKIP":
                print(f"  {run.detail}")
            facts.update(run.facts)
            runs.append(run)
    except KeyboardInterrupt:
        print(format_report(runs, evaluate_targets(facts)))
        print("interrupted: the steps above ran, every process this check started was stopped")
        return 130
    targets = evaluate_targets(facts)
    print(format_report(runs, targets))
    if 5 in args.steps:
        print(f"\nexecuted notebooks: {args.out / 'notebooks' / 'index.html'}")
    bad = any(r.status in ("FAIL", "TIMEOUT") for r in runs) or any(t.status == "FAIL" for t in targets)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
