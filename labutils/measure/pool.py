"""A pool of N local ranks started once and reused: the engine behind every spawned measurement.

Starting ranks costs seconds (spawn, import torch, set up gloo or NCCL), so a notebook's kernel
starts them once, at its first measurement, and hands every later one to the same processes:

    pool = shared_pool(2, "gloo", "cpu")
    rows = pool.run(worker, kwargs={...}, timeout_s=120)            # every rank: results by rank
    base = pool.run(worker, kwargs={...}, timeout_s=120, ranks=1)   # rank 0 alone, the others idle

Every rank sits in a loop taking tasks (a picklable function and its arguments) from its own
inbox. The process group, the CPU placement (labutils.measure.placement) and the preflight
(`launch.preflight_for`) are set up once, when the pool starts; the group's collective timeout is
fixed then too (`group_timeout_share` of the time left to the call that started it).

`ranks=1` runs the worker on rank 0 alone with a RankContext of world size 1: inside such a solo
task `launch.group_size()` (also `timing.group_size`) is 1, and every collective helper acts as in a one-rank world. The
baseline then has rank 0's cores and threads, the same "one device" as one rank of the N-rank run.

Every run is bounded as a launch always was: an error, crash or hang in any rank raises RankError
naming the rank (`_blame`: the rank that caused it, not the peers that noticed), and then EVERY
rank process is stopped; the next `run` starts a fresh set. Ctrl-C stops them too, and so does the
end of the launching process (atexit, and each rank asks the kernel to kill it when its parent dies).

`launch()` is the one-shot form: start a pool, run once, stop. `shared_pool()` keeps one pool per
process (one at a time: they share the cores); another configuration stops the old one first.

LAB_RANK_LOG: when set, the name of a file to which the pool appends one line per rank process it
starts ("<pid> rank <r> of <n> <backend>/<device> parent <pid>"): a way to see which rank processes a
kernel started, and how often. `RankPool.processes_started` counts them per pool.
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing as mp
import os
import pickle
import queue as _queue
import signal
import sys
import time
import traceback
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch.distributed as dist
from tqdm.auto import tqdm

from labutils.core.inputs import LabInputError, check_int
from labutils.measure.launch import (
    MAX_TIMEOUT_S,
    PREFLIGHT_TIMEOUT_S,
    RankError,
    free_port,
    gpu_numa_nodes,
    init_rank,
    preflight_for,
    solo,
)
from labutils.measure.placement import check_local_ranks, machine_placement, pin_rank, set_rank_threads

RANK_LOG_ENV = "LAB_RANK_LOG"
ONE_SHOT_TIMEOUT_SHARE = 0.8  # a one-shot launch's collectives give up at 80% of the time left (see _rank_main)
STOP_GRACE_S = 2.0  # a rank asked to stop leaves its loop at once; after this it is terminated


def _die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # pragma: no cover - not Linux
        pass


def _rank_main(rank, nproc, port, backend, device, placement, deadline_unix, timeout_share, preflight, first_task,
               inbox, out_q, parent_pid):
    """One rank: join the group, run the preflight, run `first_task` (the call that started the pool; None
    for an idle rank), then the tasks of `inbox` until told to stop (None).

    The first task travels with the process's arguments: it is unpickled (its modules imported) while
    the process starts, before the collectives' time is counted, as every later task's modules are."""
    _die_with_parent()
    if os.getppid() != parent_pid:  # parent died before prctl took effect
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; Ctrl-C reaches it first
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    try:
        set_rank_threads(placement)
        # Collectives give up at a share of the time left, counted after start-up (slow on a busy
        # machine): below 1 the peers of a hung rank then report before the launcher's deadline.
        timeout_s = max(1.0, timeout_share * (deadline_unix - time.time()))

        def stage(name: str) -> None:
            out_q.put(("stage", rank, name))
        stage("joining")
        ctx = init_rank(backend, device, rank, nproc, rank, timeout_s,
                        channel=lambda payload: out_q.put(("report", rank, payload)))
        if preflight is not None:
            stage("preflight")
            preflight(ctx, stage)
            stage("ready")
        pin_rank(placement, rank)  # after init: see labutils.measure.placement on gloo's threads
        out_q.put(("started", rank, os.getpid()))
        task = first_task if first_task is not None else _next_task(inbox)
        while task is not None:
            worker, args, kwargs, ranks = task
            if ranks == 1 and nproc > 1:
                with solo():
                    result = worker(replace(ctx, world_size=1), *args, **kwargs)
            else:
                result = worker(ctx, *args, **kwargs)
            out_q.put(("result", rank, result))
            task = _next_task(inbox)
        status = 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        # Report before tearing the group down: peers then see a closed connection *after* this.
        out_q.put(("error", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        status = 1
    out_q.close()
    out_q.join_thread()
    if status:
        os._exit(status)
    if dist.is_initialized():
        dist.destroy_process_group()


def _next_task(inbox):
    """Wait for the next task: (worker, args, kwargs, ranks), or None to stop."""
    raw = inbox.get()
    return None if raw is None else pickle.loads(raw)


def _stop_all(procs) -> None:
    procs = [p for p in procs if p.pid is not None]  # a failed start leaves some never started
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(2)


def _check_timeout(name: str, value) -> float:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < MAX_TIMEOUT_S):
        raise LabInputError(f"{name}={value!r} is outside the allowed range (0, {MAX_TIMEOUT_S:g}) s")
    return float(value)


def _log_start(pid: int, rank: int, nproc: int, backend: str, device: str) -> None:
    """One line per started rank process in $LAB_RANK_LOG (when set)."""
    path = os.environ.get(RANK_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{pid} rank {rank} of {nproc} {backend}/{device} parent {os.getpid()}\n")


_LIVE: weakref.WeakSet = weakref.WeakSet()  # pools with running ranks, stopped at exit


@atexit.register
def _stop_live_pools() -> None:
    for pool in list(_LIVE):
        pool.stop()


class RankPool:
    """`nproc` local ranks (spawned, 127.0.0.1), started by the first `run` and reused by the next.

    `nproc` is bounded by what the machine holds (`placement.check_local_ranks`); CPU placement as
    `machine_placement(like_ranks or nproc, threads_per_rank)`, on CUDA from the GPUs' NUMA nodes.
    `like_ranks=N` plans as for N ranks and runs the first `nproc` of them. `preflight` and
    `preflight_timeout_s` as in `launch`. `group_timeout_share`: the collectives' timeout is this
    share of the time left to the call that starts the ranks.
    """

    def __init__(self, nproc: int, backend: str = "gloo", device: str = "cpu", *, threads_per_rank: int | None = None,
                 like_ranks: int | None = None, oversubscribe: bool | None = None, preflight=None,
                 preflight_timeout_s: float = PREFLIGHT_TIMEOUT_S, group_timeout_share: float = 1.0):
        self.nproc = check_local_ranks(nproc, oversubscribe=oversubscribe)
        self._early: dict[str, dict[int, Any]] = {}
        self.preflight_timeout_s = _check_timeout("preflight_timeout_s", preflight_timeout_s)
        self.backend, self.device = backend, device
        self.preflight = preflight_for(backend, preflight)
        plan_ranks = self.nproc if like_ranks is None else check_int("like_ranks", like_ranks, low=self.nproc)
        gpu_nodes = gpu_numa_nodes(plan_ranks) if device == "cuda" else ()
        self.placement = machine_placement(plan_ranks, threads_per_rank, gpu_nodes=gpu_nodes)
        self.group_timeout_share = group_timeout_share
        self.processes_started = 0
        self._procs: list = []
        self._inboxes: list = []
        self._out_q = None

    @property
    def config(self) -> tuple:
        """What makes two pools interchangeable: rank count, backend, device, placement, preflight."""
        return (self.nproc, self.backend, self.device, self.placement, self.preflight)

    @property
    def running(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    @property
    def pids(self) -> list[int]:
        """The process ids of the running ranks, by rank ([] when stopped)."""
        return [p.pid for p in self._procs]

    def run(self, worker: Callable, args: tuple = (), kwargs: dict | None = None, timeout_s: float = 300.0,
            on_report: Callable[[int, Any], None] | None = None, ranks: int | None = None) -> list:
        """Run `worker(ctx, *args, **kwargs)` on every rank (or, `ranks=1`, on rank 0 alone with a
        one-rank context); return the results by rank. `timeout_s` bounds the run, start-up included
        when the ranks are not running yet. Raises RankError naming the rank that raised, crashed
        or hung; every rank process is stopped then (Ctrl-C too), and the next run starts afresh."""
        timeout_s = _check_timeout("timeout_s", timeout_s)
        ranks = self.nproc if ranks is None else check_int("ranks", ranks, low=1, high=self.nproc)
        if ranks not in (1, self.nproc):
            raise LabInputError(f"ranks={ranks} must be 1 (rank 0 alone) or the pool's {self.nproc}")
        task = (worker, tuple(args), dict(kwargs or {}), ranks)
        raw = bytes(ForkingPickler.dumps(task))  # an unpicklable task fails here, not in a rank
        deadline = time.monotonic() + timeout_s
        done = False
        try:
            if self.running:
                for inbox in self._inboxes[:ranks]:
                    inbox.put(raw)
            else:
                self.stop()
                self._start(deadline, timeout_s, on_report, task)
            results = self._wait("result", ranks, deadline, timeout_s, on_report)
            done = True
            return [results[r] for r in range(ranks)]
        finally:
            if not done:
                self._kill()

    def stop(self) -> None:
        """Stop every rank: ask each to leave its loop, terminate those still there after a grace."""
        if not self._procs:
            return
        for inbox, p in zip(self._inboxes, self._procs):
            if p.is_alive():
                inbox.put(None)
        end = time.monotonic() + STOP_GRACE_S
        for p in self._procs:
            if p.pid is not None:
                p.join(max(0.0, end - time.monotonic()))
        self._kill()

    def _kill(self) -> None:
        _stop_all(self._procs)
        for q in [*self._inboxes, self._out_q]:
            if q is not None:
                q.close()
                q.cancel_join_thread()
        self._procs, self._inboxes, self._out_q = [], [], None
        _LIVE.discard(self)

    def _start(self, deadline: float, timeout_s: float, on_report, task: tuple) -> None:
        ctx = mp.get_context("spawn")
        self._out_q = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.nproc)]
        port = free_port()
        deadline_unix = time.time() + (deadline - time.monotonic())
        self._procs = [ctx.Process(target=_rank_main, name=f"lab-rank{r}", daemon=True,
                                   args=(r, self.nproc, port, self.backend, self.device, self.placement, deadline_unix,
                                         self.group_timeout_share, self.preflight, task if r < task[3] else None,
                                         self._inboxes[r], self._out_q, os.getpid()))
                       for r in range(self.nproc)]
        self._early: dict[str, dict[int, Any]] = {}  # messages that came before they were waited for
        _LIVE.add(self)
        for r, p in enumerate(self._procs):
            p.start()
            self.processes_started += 1
            _log_start(p.pid, r, self.nproc, self.backend, self.device)
        self._wait("started", self.nproc, deadline, timeout_s, on_report, starting=True)

    def _wait(self, want: str, ranks: int, deadline: float, timeout_s: float, on_report,
              starting: bool = False) -> dict:
        """Gather the `want` message of ranks 0..ranks-1; RankError (blamed) on an error, a death or
        the deadline; while `starting`, also the preflight's own deadline."""
        out_q, procs = self._out_q, self._procs
        got: dict[int, Any] = {}
        errors: dict[int, str] = {}
        stages: dict[int, set[str]] = {r: set() for r in range(self.nproc)}
        preflight_deadline = None  # set when the last rank starts joining the group (start-up is not timed)
        idle = {r: None for r in range(ranks, self.nproc)}  # ranks without a task count as finished
        # A rank whose first task needs no peer can send its result before a slower rank has said it
        # started: that result was kept aside while the pool waited for "started" (see below).
        got.update(self._early.pop(want, {}))

        def fail(wait_s: float) -> RankError:
            self._collect(want, got, errors, on_report, wait_s)
            return _blame(procs, {**got, **idle}, errors, timeout_s)

        while len(got) < ranks:
            if (starting and self.preflight is not None and preflight_deadline is not None
                    and time.monotonic() > preflight_deadline and not all("ready" in s for s in stages.values())):
                self._collect(want, got, errors, on_report, wait_s=0.2)
                raise (_blame(procs, got, errors, timeout_s) if errors
                       else _preflight_error(stages, self.preflight_timeout_s))
            try:
                kind, rank, payload = out_q.get(timeout=0.05)
            except _queue.Empty:
                if any(p.exitcode is not None for p in procs) or time.monotonic() > deadline:
                    # a peer's own time-out may still be on its way (a loaded machine reports late):
                    # wait for it, so that the rank that hung is the one named
                    raise fail(STOP_GRACE_S) from None
                continue
            if kind == "stage":
                stages[rank].add(payload)
                if preflight_deadline is None and all(stages.values()):
                    preflight_deadline = time.monotonic() + self.preflight_timeout_s
            elif kind == "report":
                if on_report is not None:
                    on_report(rank, payload)
            elif kind == want:
                got[rank] = payload
            elif kind == "error":
                errors[rank] = payload
                raise fail(1.0)
            elif kind in ("started", "result"):  # early: kept for the `_wait` that wants it
                self._early.setdefault(kind, {})[rank] = payload
        return got

    def _collect(self, want: str, got: dict, errors: dict, on_report, wait_s: float) -> None:
        """Gather the messages still in flight for up to `wait_s` seconds."""
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:
                kind, rank, payload = self._out_q.get(timeout=0.05)
            except _queue.Empty:
                continue
            if kind == "error":
                errors.setdefault(rank, payload)
            elif kind == want:
                got[rank] = payload
            elif kind == "report" and on_report is not None:
                on_report(rank, payload)
            elif kind in ("started", "result"):
                self._early.setdefault(kind, {})[rank] = payload


_SHARED: RankPool | None = None


def shared_pool(nproc: int, backend: str = "gloo", device: str = "cpu", threads_per_rank: int | None = None, *,
                oversubscribe: bool | None = None) -> RankPool:
    """This process's pool for `nproc` ranks on `backend`/`device` (threads as `machine_placement`):
    the running one when its configuration is the same, else a new one (the old one stopped first:
    one pool at a time, they share the cores). Its ranks start at its first `run`."""
    global _SHARED
    wanted = RankPool(nproc, backend, device, threads_per_rank=threads_per_rank, oversubscribe=oversubscribe)
    if _SHARED is not None and _SHARED.config == wanted.config:
        return _SHARED
    if _SHARED is not None:
        _SHARED.stop()
    _SHARED = wanted
    return wanted


def stop_shared_pool() -> None:
    """Stop this process's shared pool, if any (its ranks give back their cores and GPU memory)."""
    global _SHARED
    if _SHARED is not None:
        _SHARED.stop()
    _SHARED = None


def launch(worker: Callable, nproc: int, *, args: tuple = (), kwargs: dict | None = None,
           backend: str = "gloo", device: str = "cpu", timeout_s: float = 300.0,
           threads_per_rank: int | None = None, like_ranks: int | None = None,
           on_report: Callable[[int, Any], None] | None = None, oversubscribe: bool | None = None,
           preflight=None, preflight_timeout_s: float = PREFLIGHT_TIMEOUT_S) -> list:
    """Run `worker(ctx, *args, **kwargs)` on `nproc` fresh local ranks; return the results by rank.
    The one-shot pool: start, run once, stop.

    `nproc` is bounded by what the machine holds (`placement.check_local_ranks`: two ranks per
    core, at least 8; `oversubscribe=True` or LAB_OVERSUBSCRIBE=1 allows 16 per core), checked
    before any process starts.

    Ranks rendezvous on 127.0.0.1 at a free port. `timeout_s` bounds the whole run (and each
    collective, at 80% of the time left after start-up). Raises RankError naming the rank that
    raised, crashed or hung; every child process is stopped before this function returns or
    raises, Ctrl-C included.

    CPU placement (labutils.measure.placement.machine_placement): every rank gets a set of cores of its
    own and one torch thread per core, `threads_per_rank` of them when given. `like_ranks=N`
    plans as for N ranks and runs the first `nproc` of them: a one-rank baseline then gets the
    same CPUs and threads as rank 0 of the N-rank run it is compared with. On CUDA a rank's cores
    come from its GPU's NUMA node when NVML or sysfs says which (`gpu_numa_nodes`).

    Preflight (`preflight_for`: on by default for NCCL, off for gloo): every rank makes one small
    all-reduce first; when it has not finished on every rank `preflight_timeout_s` after the
    last rank started joining the group (NCCL sets up its communicator there), the run stops
    with a RankError naming the rank(s) that stalled before it, or, when all were waiting in it,
    saying that the link hangs.
    """
    _check_timeout("timeout_s", timeout_s)
    pool = RankPool(nproc, backend, device, threads_per_rank=threads_per_rank, like_ranks=like_ranks,
                    oversubscribe=oversubscribe, preflight=preflight, preflight_timeout_s=preflight_timeout_s,
                    group_timeout_share=ONE_SHOT_TIMEOUT_SHARE)
    try:
        return pool.run(worker, args, kwargs, timeout_s=timeout_s, on_report=on_report)
    finally:
        pool.stop()


def _preflight_error(stages: dict[int, set[str]], timeout_s: float) -> RankError:
    """Name the rank(s) that stalled in the preflight: those that never reached its all-reduce
    (their peers waited in it for them); when every late rank was in it, the link hangs."""
    late = [r for r, s in sorted(stages.items()) if "ready" not in s]
    stalled = [r for r in late if "all_reduce" not in stages[r]]
    waiting = [r for r in late if r not in stalled]
    if stalled:
        where = {r: "before the preflight all-reduce" if "preflight" in stages[r] else "joining the process group"
                 for r in stalled}
        said = "; ".join(f"rank {r} stalled {w}" for r, w in where.items())
        peers = f" (rank(s) {', '.join(map(str, waiting))} waited in the all-reduce)" if waiting else ""
        return RankError(f"preflight did not finish within {timeout_s:g} s: {said}{peers}; all ranks were stopped",
                         rank=stalled[0] if len(stalled) == 1 else None)
    ranks = ", ".join(map(str, late))
    return RankError(f"preflight did not finish within {timeout_s:g} s: rank(s) {ranks} entered one small all-reduce "
                     "and it never completed, so the link between the GPUs hangs (on NCCL often its peer-to-peer "
                     "path: rerun with NCCL_P2P_DISABLE=1, and NCCL_DEBUG=INFO shows the path); all ranks were stopped",
                     rank=late[0] if len(late) == 1 else None)


_SECONDARY = ("connection closed", "connection reset", "timed out", "timeout", "broken pipe")


def _is_secondary(text: str) -> bool:
    """An error that reports a peer's trouble (closed socket, time-out) rather than its own."""
    head = text.splitlines()[0].lower() if text else ""
    return any(word in head for word in _SECONDARY)


def _blame(procs, results: dict, errors: dict, timeout_s: float) -> RankError:
    """Name the rank that caused the failure, not the peers that noticed it.

    A rank that died without a message (crash, kill) comes first; then, when the first error is
    a peer's time-out, the ranks still running silently (they hung); else the first error.
    `results` holds the ranks that finished (or had nothing to do).
    """
    silent_dead = [r for r, p in enumerate(procs)
                   if p.exitcode not in (None, 0) and r not in errors and r not in results]
    if silent_dead:
        r = silent_dead[0]
        also = f"; peers then failed: {sorted(errors)}" if errors else ""
        return RankError(f"rank {r} died with exit code {procs[r].exitcode}{also}", rank=r)
    silent_alive = [r for r, p in enumerate(procs) if p.is_alive() and r not in errors and r not in results]
    primary = [r for r, text in errors.items() if not _is_secondary(text)]
    first = primary[0] if primary else next(iter(errors), None)
    if silent_alive and not primary:
        ranks = ", ".join(map(str, silent_alive))
        return RankError(f"rank(s) {ranks} stopped responding (no result within {timeout_s:g} s); "
                         "all ranks were stopped", rank=silent_alive[0] if len(silent_alive) == 1 else None)
    if first is not None:
        return RankError(f"rank {first} failed: {errors[first]}", rank=first)
    missing = [r for r in range(len(procs)) if r not in results]
    return RankError(f"rank(s) {missing} did not finish within {timeout_s:g} s; all ranks were stopped",
                     rank=missing[0] if len(missing) == 1 else None)


# --- progress bars for the ranks' reports -------------------------------------------------------------
# A progress bar in the launching process, moved by rank 0's reports.
#
# A worker calls `ctx.report({"done": i, "of": n})` after each unit of work; `rank_progress`
# yields the `on_report(rank, payload)` that labutils.measure.launch.launch (or run_this_rank) takes
# and moves a tqdm.auto bar to rank 0's count. Every rank does the same work, so one rank's count
# is the job's count.

@contextmanager
def rank_progress(total: int, desc: str, enabled: bool = True, unit: str = "it", leave: bool = False):
    """Yield `on_report` for a launch (None when not `enabled`); the bar closes on exit, also on error.

    The bar shows rank 0's payload["done"] out of payload["of"] (when given, else `total`);
    reports without "done" and reports of other ranks are ignored.
    """
    if not enabled:
        yield None
        return

    bar = tqdm(total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr)

    def on_report(rank: int, payload) -> None:
        if rank != 0 or not isinstance(payload, dict) or "done" not in payload:
            return
        if payload.get("of"):
            bar.total = payload["of"]
        bar.update(payload["done"] - bar.n)

    try:
        yield on_report
    finally:
        bar.close()
