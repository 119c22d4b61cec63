"""Honest timers: CUDA events on a GPU, barrier-synchronised perf_counter on the CPU.

GPU work is asynchronous: a host clock read right after a launch measures the launch, not the
work. On CUDA we record events on the stream and read them after synchronising. On the CPU
(gloo) collectives block, and a barrier before the first iteration starts every rank's clock
together. Warm-up is never timed: callers run it before `time_loop`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from labutils.measure.launch import barrier_kwargs, group_size


def is_cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def synchronize(device: str) -> None:
    """Wait until all queued work on `device` has finished (no-op on the CPU)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def barrier(device: str = "cpu") -> None:
    """All ranks wait here (when more than one takes part, `group_size`), after finishing queued device work.

    NCCL's barrier is told which GPU this rank uses (`launch.barrier_kwargs`); gloo needs nothing.
    """
    synchronize(device)
    if group_size() > 1:
        dist.barrier(**barrier_kwargs(dist.get_backend(), device))


def line_up(device: str = "cpu", untimed_step: Callable[[], object] | None = None) -> None:
    """Start a timed repetition with every rank in step.

    A barrier alone is not enough: ranks leave it up to a scheduler wake-up apart (milliseconds
    on a busy CPU), and a step timed straight after it charges that skew to its first collective.
    When `untimed_step` (a step that communicates) is given, it runs once, untimed, after the
    barrier: its all-reduce lines the ranks up as consecutive layers or training steps are.
    """
    barrier(device)
    if untimed_step is not None:
        untimed_step()


class _Clock:
    """Start/stop a device clock. Elapsed time in milliseconds after `elapsed_ms()`."""

    def __init__(self, device: str):
        self.device = str(device)
        if is_cuda(self.device):
            self._start = torch.cuda.Event(enable_timing=True)
            self._stop = torch.cuda.Event(enable_timing=True)
        self._t0 = self._t1 = None

    def start(self) -> None:
        if is_cuda(self.device):
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if is_cuda(self.device):
            self._stop.record()
        else:
            self._t1 = time.perf_counter()

    def elapsed_ms(self) -> float:
        if is_cuda(self.device):
            self._stop.synchronize()
            return float(self._start.elapsed_time(self._stop))
        return (self._t1 - self._t0) * 1e3


def time_loop(fn: Callable[[], object], iters: int, device: str = "cpu", sync_ranks: bool = True) -> float:
    """Mean milliseconds per call of `fn` over `iters` back-to-back calls.

    With `sync_ranks`, a barrier first lines up every rank's start (synchronised clocks).
    Total time = stop - start after the device has drained; per call = total / iters.
    """
    if iters < 1:
        raise ValueError(f"iters={iters} is outside the allowed range [1, inf)")
    if sync_ranks:
        barrier(device)
    else:
        synchronize(device)
    clock = _Clock(device)
    clock.start()
    for _ in range(iters):
        fn()
    clock.stop()
    synchronize(device)
    return clock.elapsed_ms() / iters


class SectionTimer:
    """Accumulates time per named section: `with timer.section("compute"): ...`.

    On CUDA each section is a pair of events resolved by `totals_ms()`; on the CPU each is a
    perf_counter interval. `totals_ms()` returns {name: summed ms}; `samples_ms()` every interval.
    """

    def __init__(self, device: str = "cpu"):
        self.device = str(device)
        self._pending: list[tuple[str, _Clock]] = []

    @contextmanager
    def section(self, name: str):
        clock = _Clock(self.device)
        clock.start()
        try:
            yield
        finally:
            clock.stop()
            self._pending.append((name, clock))

    def samples_ms(self) -> dict[str, list[float]]:
        synchronize(self.device)
        out: dict[str, list[float]] = {}
        for name, clock in self._pending:
            out.setdefault(name, []).append(clock.elapsed_ms())
        return out

    def totals_ms(self) -> dict[str, float]:
        return {name: sum(v) for name, v in self.samples_ms().items()}


@dataclass(frozen=True)
class RankStats:
    """One number seen from all ranks: the mean over ranks and the slowest rank."""

    mean: float
    max: float
    min: float


def across_ranks(value: float, device: str = "cpu") -> RankStats:
    """All-reduce `value` to its mean, max and min over ranks (every rank must call this)."""
    world = group_size()
    if world == 1:
        return RankStats(value, value, value)
    dev = device if is_cuda(device) else "cpu"
    t = torch.tensor([value, value, -value], dtype=torch.float64, device=dev)
    total = t[:1].clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    extremes = t[1:].clone()
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    return RankStats(float(total[0]) / world, float(extremes[0]), -float(extremes[1]))


def agree_iters(probe_ms: float, budget_ms: float, min_iters: int, max_iters: int, device: str) -> int:
    """Rank 0 turns its probe time into an iteration count and broadcasts it to every rank."""
    want = budget_ms / probe_ms if probe_ms > 0 else max_iters
    iters = torch.tensor([int(min(max_iters, max(min_iters, math.ceil(want))))], dtype=torch.int64, device=device)
    if group_size() > 1:
        dist.broadcast(iters, src=0)
    return int(iters.item())


def round_s(run_round: Callable[[], object], device: str = "cpu") -> float:
    """Wall-clock seconds of one complete round, `run_round()` between a barrier and the drained
    device: every barrier, line-up step, reference pass and variant the round makes is inside."""
    barrier(device)
    started = time.perf_counter()
    run_round()
    synchronize(device)
    return time.perf_counter() - started


def agree_reps(plans: list, device: str) -> list:
    """Rank 0's repetition plans (labutils.model.sizing.Reps) on every rank: each rank passes
    its own, rank 0's are broadcast, so all ranks run the same counts and stop together."""
    flat = [[p.reps, int(p.budget_cut), int(p.fits)] for p in plans]
    t = torch.tensor(flat, dtype=torch.int64, device=device).reshape(len(plans), 3)
    if group_size() > 1:  # not in a solo task (rank 0 alone in an N-rank pool): nobody to tell
        dist.broadcast(t, src=0)
    return [replace(p, reps=int(r), budget_cut=bool(c), fits=bool(f)) for p, (r, c, f) in zip(plans, t.cpu().tolist())]
