"""Data-parallel training, inside the ranks: one real training step on 1 and N ranks and where its
time goes (notebook 10; launched by labutils.experiments.data_parallel).

The step is a small MLP (`depth` square Linear layers of `width`, ReLU between) on a synthetic
regression batch, trained with plain SGD. Its gradient is `4 * params` bytes (float32), so the
width sets the size of the all-reduce: `mlp_for_gradient_bytes(64 * 2**20)` builds a 64 MiB one.

Three ways to run it, all through `labutils.measure.launch` with `train_worker` on every rank:

- "single":     one rank, no communication: the baseline.
- "ddp":        N ranks, torch DistributedDataParallel. Gradients are all-reduced in buckets
                (`bucket_cap_mb`) *during* backward, so communication can hide behind compute.
- "no_overlap": N ranks, DDP's hooks silenced with `no_sync()`; after backward one all-reduce of
                all gradients (a flat buffer the gradients live in). Nothing can hide.

Per step: forward, backward, all-reduce and optimizer time (CUDA events on GPU, perf_counter
after a barrier on CPU), the whole step, and the exposed communication: the all-reduce itself
for "no_overlap" (after a barrier timed apart as `wait_ms`: waiting for the slowest rank); for
"ddp", backward minus a backward without sync measured in the same run (waiting included).
Warm-up steps are not timed; rank 0 fixes the step count for all from one complete round timed on
the wall clock and the time budget (labutils.model.sizing); configurations of one launch
are timed in interleaved rounds; `summarize` gives the median and p10/p90 over steps. Every
rank, the one-rank baseline too, runs one CPU thread (`THREADS_PER_RANK`, see `data_parallel.measure_ddp_steps`).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import record_function

from labutils.core.inputs import LabInputError, check_choice, check_int, check_range
from labutils.measure.timeline import profile_step
from labutils.measure.timing import (
    SectionTimer,
    agree_reps,
    barrier,
    group_size,
    line_up,
    synchronize,
    time_loop,
)
from labutils.model.ddp_model import DEFAULT_BUCKET_MB, mlp_gradient_bytes, mlp_param_count
from labutils.model.sizing import Reps, plan_reps

DDP_MODES = ("single", "ddp", "no_overlap")


DDP_SECTIONS = ("forward_ms", "backward_ms", "wait_ms", "allreduce_ms", "optimizer_ms")


def ddp_cap_mb(bucket_cap_mb: float) -> float | None:
    """What to pass DDP as `bucket_cap_mb`: None for its default cap, so that the run has DDP's default
    buckets (a 1 MiB first bucket, then 25 MiB: `ddp_model.first_bucket_mb`), else the cap."""
    return None if float(bucket_cap_mb) == DEFAULT_BUCKET_MB else float(bucket_cap_mb)


def build_mlp(width: int, depth: int, seed: int = 0, device: str = "cpu"):
    """The MLP, initialised from `seed` on `device` (every rank of one device type builds the same one)."""
    torch.manual_seed(seed)
    layers = []
    for i in range(depth):
        layers.append(torch.nn.Linear(width, width, device=device))
        if i < depth - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def batch_rows(first: int, rows: int, width: int, seed: int = 1, device: str = "cpu"):
    """Rows first .. first + rows - 1 of the regression batch (inputs, targets), drawn on `device`
    in float32. Row i comes from its own seed (seed * 1_000_003 + i), so a rank draws only its own
    rows and the ranks' rows together are the global batch one rank draws whole."""
    gen = torch.Generator(device=torch.device(device))
    xs, ys = [], []
    for i in range(first, first + rows):
        gen.manual_seed(seed * 1_000_003 + i)
        xs.append(torch.randn(width, generator=gen, device=device))
        ys.append(torch.randn(width, generator=gen, device=device))
    return torch.stack(xs), torch.stack(ys)


def synthetic_batch(global_batch: int, width: int, seed: int = 1, device: str = "cpu"):
    """A fixed regression batch (inputs, targets) of `global_batch` rows, the same on every rank."""
    return batch_rows(0, global_batch, width, seed, device)


def rank_batch(batch_per_rank: int, width: int, rank: int, seed: int = 1, device: str = "cpu"):
    """Rank `rank`'s rows of the global batch, and only those: rows rank * b .. (rank + 1) * b - 1."""
    return batch_rows(rank * batch_per_rank, batch_per_rank, width, seed, device)


def rank_slice(global_batch: int, rank: int, world_size: int) -> slice:
    """Rank `rank`'s rows of the global batch; the batch must split evenly."""
    if global_batch % world_size:
        raise LabInputError(f"global_batch={global_batch} does not split evenly over {world_size} ranks")
    per_rank = global_batch // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


@dataclass(frozen=True)
class StepConfig:
    """One measured run: the model, the per-rank batch, the way it runs, and how many steps.

    `steps` timed steps follow `warmup` untimed ones. With a time budget (train_worker's `budget_s`),
    or without one `min_time_s` > 0, rank 0 picks the count between `steps` and `max_steps` so the
    timed rounds last about the share (labutils.model.sizing.plan_reps), and tells every rank.
    """

    width: int
    depth: int = 4
    batch_per_rank: int = 32
    mode: str = "ddp"
    bucket_cap_mb: float = DEFAULT_BUCKET_MB
    steps: int = 10
    warmup: int = 2
    min_time_s: float = 0.0
    max_steps: int = 200
    lr: float = 1e-3
    seed: int = 0

    def __post_init__(self):
        check_choice("mode", self.mode, DDP_MODES)
        check_int("width", self.width, low=1, high=65536)
        check_int("depth", self.depth, low=1, high=64)
        check_int("batch_per_rank", self.batch_per_rank, low=1)
        check_int("steps", self.steps, low=1)
        check_int("warmup", self.warmup, low=0)
        check_range("bucket_cap_mb", self.bucket_cap_mb, low=0, low_open=True, unit="MiB")
        check_range("min_time_s", self.min_time_s, low=0, unit="s")

    @property
    def gradient_bytes(self) -> int:
        return mlp_gradient_bytes(self.width, self.depth)


def _flat_gradients(model, device: str):
    """Give every parameter a `.grad` that is a view into one flat buffer, and return the buffer.

    Backward then accumulates straight into the buffer, so one all-reduce of the buffer
    reduces every gradient without a copy.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.zeros(sum(p.numel() for p in params), device=device)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


class RankStep:
    """The model, optimizer and this rank's batch for one StepConfig, and the step itself."""

    def __init__(self, cfg: StepConfig, ctx):
        self.cfg, self.device, self.world = cfg, ctx.device, ctx.world_size
        model = build_mlp(cfg.width, cfg.depth, cfg.seed, ctx.device)
        self.x, self.y = rank_batch(cfg.batch_per_rank, cfg.width, ctx.rank, cfg.seed + 1, ctx.device)
        self.flat = _flat_gradients(model, ctx.device) if cfg.mode == "no_overlap" else None
        if cfg.mode == "single":
            self.model = model
        else:
            ids = [torch.device(ctx.device).index] if ctx.device.startswith("cuda") else None
            # DDP: gradients live in its buckets (no copy in or out), as no-overlap's live in the flat buffer
            self.model = DDP(model, device_ids=ids, bucket_cap_mb=ddp_cap_mb(cfg.bucket_cap_mb),
                             gradient_as_bucket_view=cfg.mode == "ddp")
        self.opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        self.params = list(model.parameters())

    def loss(self):
        return torch.nn.functional.mse_loss(self.model(self.x), self.y)

    def run(self, timer) -> None:
        """One training step; each part inside `timer.section(name)` (`timer` may be None)."""
        sec = timer.section if timer else (lambda name: contextlib.nullcontext())
        self.gradients(sec)
        with sec("optimizer_ms"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=False)  # keep the gradients inside their buffers

    def gradients(self, sec) -> None:
        """Forward, backward and (DDP inside backward, or after it) the gradient all-reduce."""
        quiet = self.model.no_sync() if self.cfg.mode == "no_overlap" else contextlib.nullcontext()
        with quiet:
            with sec("forward_ms"):
                loss = self.loss()
            with sec("backward_ms"):
                loss.backward()
        if self.flat is not None:
            with sec("wait_ms"):  # for the slowest rank: imbalance, kept apart from moving bytes
                barrier(self.device)
            with sec("allreduce_ms"):
                dist.all_reduce(self.flat)
                self.flat.div_(self.world)

    def backward_without_sync_ms(self) -> float:
        """Forward + backward under `no_sync()` (no communication); the backward time in ms."""
        timer = SectionTimer(self.device)
        with self.model.no_sync():
            loss = self.loss()
            with timer.section("backward"):
                loss.backward()
        ms = timer.totals_ms()["backward"]
        self.opt.zero_grad(set_to_none=False)
        return ms


def _time_one_step(step: RankStep, ddp_reference: bool) -> dict:
    """Time one step with the ranks lined up (timing.line_up: barrier, then one untimed step
    when ranks communicate); returns its parts in ms."""
    line_up(step.device, (lambda: step.run(None)) if step.cfg.mode != "single" else None)
    timer = SectionTimer(step.device)
    with timer.section("step_ms"):
        step.run(timer)
    row = {name: 0.0 for name in DDP_SECTIONS}
    row.update(timer.totals_ms())
    if step.cfg.mode == "no_overlap":
        row["exposed_comm_ms"] = row["wait_ms"] + row["allreduce_ms"]
    elif ddp_reference:
        row["backward_compute_ms"] = step.backward_without_sync_ms()
        row["exposed_comm_ms"] = max(0.0, row["backward_ms"] - row["backward_compute_ms"])
    else:
        row["exposed_comm_ms"] = 0.0 if step.cfg.mode == "single" else math.nan
    return row


def _flat_allreduce_ms(step: RankStep, reps: int = 3) -> float:
    """Median time of one all-reduce of the whole gradient, on this run's link (ms)."""
    buf = torch.zeros(sum(p.numel() for p in step.params), device=step.device)
    return float(np.median([time_loop(lambda: dist.all_reduce(buf), 1, step.device) for _ in range(reps)]))


def _mean_over_ranks(rows: list[dict], device: str) -> list[dict]:
    """Every rank's per-step rows, averaged over ranks; `step_max_ms` is the slowest rank's step."""
    keys = sorted(rows[0])
    dev = device if device.startswith("cuda") else "cpu"
    t = torch.tensor([[r[k] for k in keys] for r in rows], dtype=torch.float64, device=dev)
    steps = t[:, keys.index("step_ms")].clone()
    if group_size() > 1:  # a solo task (rank 0 alone in an N-rank pool) has nothing to reduce
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    t = (t / group_size()).cpu().numpy()
    out = [dict(zip(keys, map(float, vals))) for vals in t]
    for row, slowest in zip(out, steps.cpu().tolist()):
        row["step_max_ms"] = float(slowest)
    return out


def _check_world(cfg: StepConfig, world_size: int) -> None:
    if cfg.mode == "single" and world_size != 1:
        raise LabInputError(f"mode 'single' runs on one rank, not {world_size}")
    if cfg.mode != "single" and world_size < 2:
        raise LabInputError(f"mode {cfg.mode!r} needs at least 2 ranks, got {world_size}")


def _warm_up(step: RankStep, warmup: int) -> None:
    """Run `warmup` untimed steps (at least one: DDP settles its buckets in the first)."""
    for _ in range(max(1, warmup)):
        step.run(None)
    synchronize(step.device)


def _round(steps: dict, ddp_reference: bool, plans: dict | None = None, r: int = 0) -> dict:
    """One timed step of every configuration in `steps` (those whose plan has more than `r`
    repetitions), in turn: {index: row}."""
    return {index: _time_one_step(step, ddp_reference and step.cfg.mode == "ddp") for index, step in steps.items()
            if plans is None or r < plans[index].reps}


def _plan(cfg: StepConfig, round_s_: float, share_s: float | None) -> Reps:
    """One configuration's repetitions: as many rounds as fit its share of the budget (without a
    budget, its `min_time_s`), between its `steps` and `max_steps` (sizing.plan_reps); with
    neither, its `steps`, not cut."""
    if share_s is None:
        if cfg.min_time_s <= 0:
            return Reps(cfg.steps, budget_cut=False, fits=True)
        share_s = cfg.min_time_s
    return plan_reps(round_s_, share_s, cfg.steps, cfg.max_steps)


def train_worker(ctx, configs: list[StepConfig], ddp_reference: bool = True, interleave: bool = True,
                 budget_s: float | None = None) -> list[dict]:
    """Run the StepConfigs on this rank; return one row per timed step (means over ranks).

    With `interleave`, all configurations are built and warmed up first, then timed in rounds
    (one step of each per round), so a change in the machine's load touches them all alike;
    else one after the other (each its own group). Repetitions: after warm-up ONE complete round
    of the group (line-ups, DDP's reference backward, every configuration) is timed on the wall
    clock; rank 0 picks how many rounds fit the group's share of `budget_s` (split evenly over the
    configurations, `_plan`; the budget counts from the call's start, so building the models, the
    warm-up and the probe come out of it) and broadcasts the counts (timing.agree_reps), so every rank makes the
    same collective calls in the same order and they stop together. Each row carries `reps` and
    `budget_cut`.
    """
    rows, start, waiting = [], time.perf_counter(), len(configs)
    groups = [list(enumerate(configs))] if interleave else [[pair] for pair in enumerate(configs)]
    for group in groups:
        steps = {}
        for index, cfg in group:
            _check_world(cfg, ctx.world_size)
            steps[index] = RankStep(cfg, ctx)
            _warm_up(steps[index], cfg.warmup)
        costs = _probe_round(steps, ddp_reference, ctx.device)
        # the budget covers the whole call: building, warm-up and the probe come out of it (rank 0's
        # clock decides, agree_reps broadcasts), and the group takes its part of what is left
        left_s = None if budget_s is None else max(0.0, budget_s - (time.perf_counter() - start))
        share = None if left_s is None else left_s * len(group) / waiting
        waiting -= len(group)
        kept = _widths_that_fit(group, costs, share)
        probe_s = sum(costs[index] for index, cfg in group if cfg.width in kept)
        agreed = agree_reps([_plan(cfg, probe_s, share) if cfg.width in kept else Reps(0, True, False)
                             for _, cfg in group], ctx.device)
        plans = dict(zip(steps, agreed))
        timed = {index: [] for index in steps}
        longest = max(p.reps for p in agreed)
        for r in range(longest):
            for index, row in _round(steps, ddp_reference, plans, r).items():
                timed[index].append(row)
            ctx.report({"done": r + 1, "of": longest})
        for index, step in steps.items():
            if plans[index].reps:  # every rank agreed on the counts, so every rank skips the same ones
                rows += _finish_rows(step, _mean_over_ranks(timed[index], ctx.device), index, ctx, plans[index])
    return rows


def _probe_round(steps: dict, ddp_reference: bool, device: str) -> dict:
    """One complete round, each configuration's part timed on the wall clock (its line-up step and
    reference pass included): {index: seconds}."""
    costs = {}
    barrier(device)
    for index, step in steps.items():
        started = time.perf_counter()
        _time_one_step(step, ddp_reference and step.cfg.mode == "ddp")
        synchronize(device)
        costs[index] = time.perf_counter() - started
    return costs


def _widths_that_fit(group: list, costs: dict, share_s: float | None) -> set[int]:
    """The model widths whose least steps fit `share_s`: the widest are left out first (all their
    configurations together), the narrowest is always kept; every width without a budget."""
    widths = sorted({cfg.width for _, cfg in group})
    if share_s is None:
        return set(widths)
    while len(widths) > 1 and sum(costs[i] * (cfg.steps + 1) for i, cfg in group if cfg.width in widths) > share_s:
        widths.pop()
    return set(widths)


def _finish_rows(step: RankStep, timed: list[dict], index: int, ctx, plan: Reps) -> list[dict]:
    """Label one configuration's rows with its settings; `other_ms` makes the parts add up."""
    cfg = step.cfg
    flat_ms = _flat_allreduce_ms(step) if cfg.mode == "ddp" else math.nan
    for i, row in enumerate(timed):
        row.update(asdict(cfg), run=index, step=i, world_size=ctx.world_size, backend=ctx.backend,
                   device=ctx.device.split(":")[0], gradient_bytes=cfg.gradient_bytes,
                   global_batch=cfg.batch_per_rank * ctx.world_size, flat_allreduce_ms=flat_ms, reps=plan.reps,
                   budget_cut=plan.budget_cut)
        row["other_ms"] = row["step_ms"] - sum(row[k] for k in DDP_SECTIONS)
    return timed


def contention_worker(ctx, width: int, depth: int = 4, batch_per_rank: int = 32, reps: int = 5) -> dict:
    """Time, on every rank, backward alone, one all-reduce of a gradient-sized buffer alone, and the
    two together (the all-reduce started asynchronously just before backward, waited for after).

    Ideal overlap makes "together" the longer of the two; sharing the same cores (the CPU route:
    gloo's threads and backward run on the ranks' cores) makes it their sum or more. Median over
    `reps` aligned repetitions (one untimed first); each figure is the slowest rank's (ms).
    """
    model = build_mlp(width, depth, 0, ctx.device)
    x, y = rank_batch(batch_per_rank, width, ctx.rank, 1, ctx.device)
    count = mlp_param_count(width, depth)
    alone, beside = torch.zeros(count, device=ctx.device), torch.zeros(count, device=ctx.device)

    def loss():
        return torch.nn.functional.mse_loss(model(x), y)

    def once(what: str) -> float:
        timer = SectionTimer(ctx.device)
        value = loss() if what != "allreduce" else None
        barrier(ctx.device)
        with timer.section(what):
            if what == "backward":
                value.backward()
            elif what == "allreduce":
                dist.all_reduce(alone)
            else:
                work = dist.all_reduce(beside, async_op=True)
                value.backward()
                work.wait()
        synchronize(ctx.device)
        model.zero_grad(set_to_none=False)
        return timer.totals_ms()[what]

    samples = {k: [] for k in ("backward", "allreduce", "together")}
    for r in range(reps + 1):
        for what in samples:
            ms = once(what)
            if r:
                samples[what].append(ms)
    medians = torch.tensor([float(np.median(v)) for v in samples.values()], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    backward, allreduce, together = medians.cpu().tolist()
    return {"width": width, "depth": depth, "batch_per_rank": batch_per_rank, "gradient_bytes":
            mlp_gradient_bytes(width, depth), "backward_ms": backward, "allreduce_ms": allreduce,
            "together_ms": together, "world_size": ctx.world_size, "backend": ctx.backend,
            "device": ctx.device.split(":")[0]}


def ddp_timeline_worker(ctx, width: int = 256, depth: int = 4, batch_per_rank: int = 32, bucket_cap_mb: float = 1.0,
                    warmup: int = 2, seed: int = 0) -> dict:
    """One DDP training step (forward, backward with bucketed all-reduces, SGD) recorded on this rank.

    The model and batch are notebook 10's (build_mlp, rank_batch).
    Returns {"rank", "trace"}.
    """
    model = build_mlp(width, depth, seed, ctx.device)
    ids = [torch.device(ctx.device).index] if ctx.device.startswith("cuda") else None
    ddp = DDP(model, device_ids=ids, bucket_cap_mb=ddp_cap_mb(bucket_cap_mb))
    x, y = rank_batch(batch_per_rank, width, ctx.rank, seed + 1, ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        with record_function("lab:forward"):
            loss = torch.nn.functional.mse_loss(ddp(x), y)
        with record_function("lab:backward"):
            loss.backward()
        with record_function("lab:optimizer"):
            opt.step()
            opt.zero_grad()

    return {"rank": ctx.rank, "trace": profile_step(step, ctx.device, warmup)}
