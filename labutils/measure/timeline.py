"""One step as a timeline: where compute and communication ran, recorded with torch.profiler.

Reading order:
1. recording: every rank runs a few untimed steps, lines up at a barrier, and records ONE step
   with `torch.profiler` (CPU activity; CUDA too on a GPU) inside a `lab:step` mark;
2. merging: the ranks' Chrome traces become one trace, each rank a process of its own
   ("rank 0 · ...", "rank 1 · ..."), that Perfetto (https://ui.perfetto.dev) or
   chrome://tracing opens; `save_trace` writes it under the results folder, never overwriting;
3. parsing: one row per event with its rank, lane, kind and times in ms from the step's start.
   A lane is where the work ran: a CPU thread (the main thread; gloo's `pt_gloo_runloop`
   thread, which runs its collectives) or, on GPUs, a CUDA stream (compute kernels on the
   default stream, NCCL's kernels on a stream of their own). A kind is
   compute (operators, GPU kernels), communication (gloo/NCCL collectives, c10d calls) or copy
   (GPU memory copies); profiler marks and runtime calls are "other" and not drawn;
4. the numbers: per rank, how long compute and communication were busy (the union of their
   intervals over all lanes), how much of the communication ran while compute was running
   (overlapped) and how much did not (exposed); and the drawing, one row per lane.

The profiler costs time of its own: a recorded step is slower than a timed one; the timeline
shows order and overlap, the timed runs of notebooks 09 and 10 give the durations.

The steps recorded are the experiments' own: `labutils.experiments.data_parallel.record_ddp_step`
(notebook 10) and `labutils.experiments.split_timing.record_overlap_step` (notebook 09), each a rank
worker that calls `profile_step` and is run by `record_timeline`; every rank makes the same collective
calls in the same order.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from torch.profiler import ProfilerActivity, profile, record_function

from labutils.core.inputs import LabInputError, check_int
from labutils.core.results import reserve_path, results_dir, utc_stamp, write_atomic
from labutils.measure.pool import shared_pool
from labutils.measure.timing import barrier, is_cuda, synchronize

STEP_MARK = "lab:step"
KINDS = ("compute", "communication", "copy")  # drawn; everything else is "other"
COMM_PATTERNS = ("nccl", "gloo", "c10d::", "allreduce", "all_reduce", "allgather", "all_gather",
                 "reduce_scatter", "reducescatter", "broadcast", "record_param_comms", "processgroup")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
OTHER_CATEGORIES = ("user_annotation", "gpu_user_annotation", "python_function", "cuda_runtime", "cuda_driver",
                    "trace", "overhead", "ac2g", "fwdbwd")

# --- 1. recording one step on each rank ---------------------------------------------------------------


# libkineto (torch.profiler's C++ side) prints "USDT: ... profiler_start/profiler_stop" lines on
# stderr at every recording. Its one supported switch is the KINETO_LOG_LEVEL environment variable,
# which it reads when it first initialises in a process: 6 is above its highest level (USDT = 5).
KINETO_QUIET_LEVEL = "6"


@contextmanager
def quiet_profiler():
    """KINETO_LOG_LEVEL set to KINETO_QUIET_LEVEL while the block runs, the previous value (or its
    absence) restored after: the recording prints no profiler log lines, the rest of the process is untouched."""
    before = os.environ.get("KINETO_LOG_LEVEL")
    os.environ["KINETO_LOG_LEVEL"] = KINETO_QUIET_LEVEL
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("KINETO_LOG_LEVEL", None)
        else:
            os.environ["KINETO_LOG_LEVEL"] = before


def profile_step(step, device: str = "cpu", warmup: int = 2) -> dict:
    """Run `step()` `warmup` times, line the ranks up, record one more under torch.profiler; the trace.

    The barrier inside the recording (before the step mark) is left out by `events_frame`.

    The trace is the Chrome-trace dict torch.profiler exports ({"traceEvents": [...], ...}).
    Every rank calls this together: the barrier is a collective.
    """
    warmup = check_int("warmup", warmup, low=0, high=100)
    for _ in range(warmup):
        step()
    synchronize(device)
    barrier(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda(device) else [])
    with quiet_profiler(), profile(activities=activities) as prof:
        barrier(device)  # again: starting the profiler takes each rank its own time
        with record_function(STEP_MARK):
            step()
        synchronize(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            trace = json.load(fh)
    return trace


# --- 2. merging the ranks' traces ------------------------------------------------------------------------


def merge_traces(traces: list[dict]) -> dict:
    """One Chrome trace from the ranks' traces (in rank order): each rank's processes renumbered
    rank * 1000 + i and named "rank r · ...", flow ids kept apart, the main thread named so.

    Every event gets args.lab_rank. Timestamps are kept: local ranks share one clock.
    """
    merged = []
    for rank, trace in enumerate(traces):
        pids: dict = {}
        for event in trace.get("traceEvents", []):
            e = dict(event)
            old_pid = e.get("pid")
            if old_pid is not None:
                e["pid"] = pids.setdefault(old_pid, rank * 1000 + len(pids))
            if isinstance(e.get("id"), int):
                e["id"] = e["id"] + (rank << 40)
            args = dict(e.get("args") or {})
            args["lab_rank"] = rank
            if e.get("ph") == "M" and e.get("name") == "process_name":
                args["name"] = f"rank {rank} · {args.get('name', old_pid)}"
            if e.get("ph") == "M" and e.get("name") == "process_sort_index":
                args["sort_index"] = e["pid"]
            if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("tid") == old_pid:
                args["name"] = f"main thread {old_pid}"
            e["args"] = args
            merged.append(e)
    return {"traceEvents": merged, "displayTimeUnit": "ms",
            "otherData": {"made_by": "labutils.measure.timeline", "ranks": len(traces), "step_mark": STEP_MARK}}


# --- 3. parsing ------------------------------------------------------------------------------------------


def classify(name: str, category: str = "") -> str:
    """compute, communication, copy or other, from an event's name and category (see the module doc).

    Collectives are recognised by name (gloo:all_reduce, nccl:all_reduce, c10d::allreduce_,
    ncclDevKernel_AllReduce...), also when recorded as annotations; aten operators are compute
    even when their name says broadcast.
    """
    low, cat = str(name).lower(), str(category or "").lower()
    if low.startswith("lab:") or low.startswith("profilerstep") or cat in ("trace", "overhead", "ac2g", "fwdbwd"):
        return "other"
    if not low.startswith("aten::") and any(p in low for p in COMM_PATTERNS):
        return "communication"
    if cat in OTHER_CATEGORIES:
        return "other"
    if cat == "gpu_memcpy" or "memcpy" in low:
        return "copy"
    if cat in ("cpu_op", "kernel", "gpu_memset"):
        return "compute"
    return "other"


def _thread_label(name: str) -> str:
    """'thread 3465 (pt_gloo_runloop)' -> 'pt_gloo_runloop thread'; 'main thread 3427' stays."""
    found = re.match(r"thread \d+ \((.+)\)$", name)
    return f"{found.group(1)} thread" if found else name


def events_frame(trace: dict) -> pd.DataFrame:
    """The complete ("X") events of a merged trace, one row each: rank, lane, name, category, kind,
    start_ms and end_ms (from the earliest rank's step mark), dur_ms.

    Lanes: "CPU <thread>" for CPU threads, "GPU <d> stream <s>" for CUDA kernels and copies.
    """
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise LabInputError("trace has no traceEvents list: not a Chrome trace")
    threads: dict = {}
    for e in events:  # a thread can be named twice ("(python)", then what it calls itself): keep the latter
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            name = str((e.get("args") or {}).get("name", ""))
            key = (e.get("pid"), e.get("tid"))
            if key not in threads or not name.endswith("(python)"):
                threads[key] = name
    rows = []
    for e in events:
        if e.get("ph") != "X" or not isinstance(e.get("ts"), (int, float)):
            continue
        args, cat = e.get("args") or {}, str(e.get("cat", ""))
        if cat in GPU_CATEGORIES:
            lane = f"GPU {args.get('device', e.get('pid'))} stream {args.get('stream', e.get('tid'))}"
        else:
            lane = "CPU " + _thread_label(threads.get((e.get("pid"), e.get("tid")), f"thread {e.get('tid')}"))
        start_us, dur_us = float(e["ts"]), float(e.get("dur", 0.0))
        rows.append({"rank": int(args.get("lab_rank", 0)), "lane": lane, "name": str(e.get("name", "")),
                     "category": cat, "kind": classify(e.get("name", ""), cat), "start_us": start_us,
                     "dur_us": dur_us})
    frame = pd.DataFrame(rows, columns=["rank", "lane", "name", "category", "kind", "start_us", "dur_us"])
    if frame.empty:
        raise LabInputError("trace holds no complete events: nothing was recorded")
    marks = frame[(frame["name"] == STEP_MARK) & (frame["category"] == "user_annotation")]
    if len(marks):  # drop what a rank did before its own step began (the barrier that lines them up)
        begun = frame["rank"].map(marks.groupby("rank")["start_us"].min())
        frame = frame[begun.isna() | (frame["start_us"] >= begun)]
    t0_us = float((marks if len(marks) else frame)["start_us"].min())
    frame["start_ms"] = (frame["start_us"] - t0_us) / 1e3
    frame["dur_ms"] = frame["dur_us"] / 1e3
    frame["end_ms"] = frame["start_ms"] + frame["dur_ms"]
    return frame.drop(columns=["start_us", "dur_us"]).sort_values(["rank", "start_ms"], ignore_index=True)


def merge_intervals(pairs) -> list[tuple[float, float]]:
    """Sorted, non-overlapping (start, end) intervals covering the same time as `pairs`."""
    out: list[list[float]] = []
    for start, end in sorted((float(s), float(e)) for s, e in pairs):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def _length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a, b) -> float:
    """Total length where two merged interval lists overlap."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def subtract_intervals(a, b) -> list[tuple[float, float]]:
    """The parts of merged intervals `a` not covered by merged intervals `b`."""
    out = []
    for start, end in a:
        for b_start, b_end in b:
            if b_end <= start or b_start >= end:
                continue
            if b_start > start:
                out.append((start, b_start))
            start = max(start, b_end)
        if start < end:
            out.append((start, end))
    return out


def busy_spans(events: pd.DataFrame) -> dict[str, list[tuple[float, float]]]:
    """Per kind, the merged intervals (ms) when some lane was busy with it. Compute excludes, lane by
    lane, the time of communication calls nested inside it (a backward hook that starts an all-reduce)."""
    spans = {k: [] for k in KINDS}
    for _, lane in events.groupby("lane"):
        own = {k: merge_intervals(zip(lane[lane.kind == k]["start_ms"], lane[lane.kind == k]["end_ms"])) for k in KINDS}
        own["compute"] = subtract_intervals(own["compute"], own["communication"])
        for k in KINDS:
            spans[k].extend(own[k])
    return {k: merge_intervals(v) for k, v in spans.items()}


def summary(events: pd.DataFrame) -> pd.DataFrame:
    """Per rank, in ms: step_ms (the step mark), compute_ms and communication_ms (when some lane was
    busy with it, `busy_spans`), overlapped_ms (communication while compute ran: hidden) and
    exposed_comm_ms = communication_ms - overlapped_ms; lanes = how many lanes had work."""
    rows = []
    for rank, ev in events.groupby("rank"):
        mark = ev[(ev["name"] == STEP_MARK) & (ev["category"] == "user_annotation")]
        spans = busy_spans(ev)
        comm, both = _length(spans["communication"]), _intersection(spans["compute"], spans["communication"])
        rows.append({"rank": int(rank), "step_ms": float(mark["dur_ms"].max()) if len(mark) else float("nan"),
                     "compute_ms": _length(spans["compute"]), "communication_ms": comm, "overlapped_ms": both,
                     "exposed_comm_ms": comm - both, "copy_ms": _length(spans["copy"]),
                     "lanes": int(ev[ev.kind.isin(KINDS)]["lane"].nunique())})
    return pd.DataFrame(rows)


# --- 4. the run, the saved trace and the drawing -------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """A recorded step: the merged Chrome `trace`, its `events` (events_frame) and what was recorded."""

    trace: dict
    events: pd.DataFrame
    what: str

    @property
    def summary(self) -> pd.DataFrame:
        return summary(self.events)


def record_timeline(worker, nproc: int, kwargs: dict, backend: str, device: str, timeout_s: float,
                    what: str, threads_per_rank: int | None = None) -> Timeline:
    """Run `worker` (which returns {"rank", "trace"} from `profile_step`) on `nproc` ranks of the kernel's
    rank pool (`pool.shared_pool`) and merge their traces: the Timeline of one step, described by `what`."""
    nproc = check_int("nproc", nproc, low=1, high=64)
    per_rank = shared_pool(nproc, backend, device, threads_per_rank).run(worker, kwargs=kwargs, timeout_s=timeout_s)
    trace = merge_traces([r["trace"] for r in sorted(per_rank, key=lambda r: r["rank"])])
    return Timeline(trace, events_frame(trace), what)


def save_trace(trace: dict, kind: str = "timeline", directory: str | os.PathLike | None = None) -> Path:
    """Write `trace` as `<dir>/<kind>-<host>-<UTC stamp>[-n].json`; never overwrites an existing file.

    `directory` defaults to the `traces` folder inside the results folder (labutils.core.results:
    $LAB_RESULTS_DIR, else data/results). Open the file in https://ui.perfetto.dev ("Open trace file").
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", kind):
        raise LabInputError(f"kind={kind!r} must be letters, digits, '.', '_' or '-'")
    folder = Path(directory) if directory else results_dir() / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0] or "host"
    base = reserve_path(folder, f"{kind}-{host}-{utc_stamp()}", (".json",))
    return write_atomic(base.with_name(base.name + ".json"), json.dumps(trace))
