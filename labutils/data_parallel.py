"""Data-parallel training: one real training step on 1 and N ranks, where its time goes, and its prediction.

The step is a small MLP (`depth` square Linear layers of `width`, ReLU between) on a synthetic
regression batch, trained with plain SGD. Its gradient is `4 * params` bytes (float32), so the
width sets the size of the all-reduce: `mlp_for_gradient_bytes(64 * 2**20)` builds a 64 MiB one.

Three ways to run it, all through `labutils.launch` with `train_worker` on every rank:

- "single":     one rank, no communication: the baseline.
- "ddp":        N ranks, torch DistributedDataParallel. Gradients are all-reduced in buckets
                (`bucket_cap_mb`) *during* backward, so communication can hide behind compute.
- "no_overlap": N ranks, DDP's hooks silenced with `no_sync()`; after backward one all-reduce of
                all gradients (a flat buffer the gradients live in). Nothing can hide.

Per step: forward, backward, all-reduce and optimizer time (CUDA events on GPU, perf_counter
after a barrier on CPU), the whole step, and the exposed communication: the all-reduce itself
for "no_overlap" (after a barrier timed apart as `wait_ms`: waiting for the slowest rank); for
"ddp", backward minus a backward without sync measured in the same run (waiting included).
Warm-up steps are not timed; rank 0 fixes the step count for all; configurations of one launch
are timed in interleaved rounds; `summarize` gives the median and p10/p90 over steps. Every
rank, the one-rank baseline too, runs one CPU thread (`THREADS_PER_RANK`, see `measure`).

Prediction (times in ms, bytes, decimal GB/s): compute from the one-rank step (or, where ranks
share a GPU, from the N-rank run's own backward: `bounds_compute`); comm = the sum over DDP's
buckets of the measured all-reduce curve read at each bucket's size (`bucket_comm_ms`, log-log
interpolation of the sweep; one alpha-beta line over 1 KiB-64 MiB misses gloo's bandwidth
falling once messages leave the cache), or the line buckets * alpha_us / 1e3 + 2(N-1)/N *
grad_bytes / (busbw_GBps * 1e6) when no sweep is given; then no overlap = compute + comm (the
sum bound) and ideal overlap = forward + optimizer + max(backward, comm) (the max bound: only
backward can hide communication). `contention_worker` measures why the bounds fail on a CPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd

from labutils.collectives import agree_iters, bus_factor, element_bytes
from labutils.fit import CurvePrediction, predict_comm_ms
from labutils.units import format_size
from labutils.validate import LabInputError, check_choice, check_int, check_range

MODES = ("single", "ddp", "no_overlap")
SECTIONS = ("forward_ms", "backward_ms", "wait_ms", "allreduce_ms", "optimizer_ms")
FIRST_BUCKET_MB = 1.0  # DDP puts the last layers' gradients into a small first bucket (1 MiB)
BYTES_PER_PARAM = element_bytes("float32")


# --- the model and its gradient size ---------------------------------------------------------

def mlp_param_count(width: int, depth: int) -> int:
    """Parameters of `depth` Linear(width, width) layers with bias: depth * (width^2 + width)."""
    return depth * (width * width + width)


def mlp_gradient_bytes(width: int, depth: int) -> int:
    """Bytes all-reduced per step: 4 bytes per float32 parameter."""
    return BYTES_PER_PARAM * mlp_param_count(width, depth)


def mlp_for_gradient_bytes(target_bytes: float, depth: int = 4) -> int:
    """The width whose MLP of `depth` layers has a gradient closest to `target_bytes` (at least 8)."""
    check_range("target_bytes", target_bytes, low=1024, high=2**34, unit="bytes")
    depth = check_int("depth", depth, low=1, high=64)
    per_layer = target_bytes / BYTES_PER_PARAM / depth  # w^2 + w = per_layer
    width = (-1 + math.sqrt(1 + 4 * per_layer)) / 2
    return max(8, int(round(width)))


def build_mlp(width: int, depth: int, seed: int = 0):
    """The MLP, initialised from `seed` (every rank builds the same one)."""
    import torch

    torch.manual_seed(seed)
    layers = []
    for i in range(depth):
        layers.append(torch.nn.Linear(width, width))
        if i < depth - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def synthetic_batch(global_batch: int, width: int, seed: int = 1):
    """A fixed regression batch (inputs, targets) of `global_batch` rows, the same on every rank."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(global_batch, width, generator=gen)
    y = torch.randn(global_batch, width, generator=gen)
    return x, y


def rank_slice(global_batch: int, rank: int, world_size: int) -> slice:
    """Rank `rank`'s rows of the global batch; the batch must split evenly."""
    if global_batch % world_size:
        raise LabInputError(f"global_batch={global_batch} does not split evenly over {world_size} ranks")
    per_rank = global_batch // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def ddp_bucket_sizes(param_bytes: list[int], bucket_cap_mb: float,
                     first_bucket_mb: float = FIRST_BUCKET_MB) -> list[int]:
    """The bytes of each all-reduce DDP issues per step: parameters in reverse order, packed greedily.

    The first bucket closes at `first_bucket_mb` MiB, later ones at `bucket_cap_mb` MiB; a tensor
    larger than the cap gets a bucket of its own. (DDP's own packing, without its dtype split.)
    """
    check_range("bucket_cap_mb", bucket_cap_mb, low=0, low_open=True, unit="MiB")
    buckets: list[int] = []
    filled, cap = 0, first_bucket_mb * 2**20
    for nbytes in reversed(param_bytes):
        filled += int(nbytes)
        if filled >= cap:
            buckets.append(filled)
            filled, cap = 0, bucket_cap_mb * 2**20
    if filled:
        buckets.append(filled)
    return buckets


def ddp_bucket_count(param_bytes: list[int], bucket_cap_mb: float, first_bucket_mb: float = FIRST_BUCKET_MB) -> int:
    """How many all-reduces DDP issues per step (`ddp_bucket_sizes`)."""
    return len(ddp_bucket_sizes(param_bytes, bucket_cap_mb, first_bucket_mb))


def _mlp_param_bytes(width: int, depth: int) -> list[int]:
    sizes = []
    for _ in range(depth):
        sizes += [BYTES_PER_PARAM * width * width, BYTES_PER_PARAM * width]
    return sizes


def mlp_bucket_sizes(width: int, depth: int, bucket_cap_mb: float) -> list[int]:
    """`ddp_bucket_sizes` for the lab's MLP (weight then bias of each layer)."""
    return ddp_bucket_sizes(_mlp_param_bytes(width, depth), bucket_cap_mb)


def mlp_bucket_count(width: int, depth: int, bucket_cap_mb: float) -> int:
    """`ddp_bucket_count` for the lab's MLP (weight then bias of each layer)."""
    return len(mlp_bucket_sizes(width, depth, bucket_cap_mb))


def bucket_size_range(widths, depth: int, bucket_caps_mb=(), default_cap_mb: float = 25.0) -> tuple[int, int]:
    """(smallest, largest) all-reduce a set of runs makes, in bytes: DDP's buckets of every model
    at the default cap, of the widest at each of `bucket_caps_mb`, and each whole gradient (the
    no-overlap variant). The range an all-reduce sweep must cover to predict them all."""
    widths = [int(w) for w in np.atleast_1d(widths)]
    sizes = [b for w in widths for b in mlp_bucket_sizes(w, depth, default_cap_mb)]
    sizes += [b for c in bucket_caps_mb for b in mlp_bucket_sizes(max(widths), depth, float(c))]
    sizes += [mlp_gradient_bytes(w, depth) for w in widths]
    return int(min(sizes)), int(max(sizes))


# --- the sizes of notebook 08, a pure function of the route --------------------------------------

@dataclass(frozen=True)
class ExperimentPlan:
    """Model sizes (gradient MiB), per-rank batch, DDP bucket caps, steps and warm-up of notebook 08,
    and why they suit the route."""

    gradient_mib: tuple[float, ...]
    batch_per_rank: int
    bucket_caps_mb: tuple[float, ...]
    steps: int
    warmup: int
    why: str


def experiment_plan(route, quick: bool) -> ExperimentPlan:
    """The sizes for `route` (a machine.Route; only its device and GPU sharing matter).

    The bounds say something only when backward and the all-reduce are of the same order. Their
    ratio is about batch x busbw / flop rate, whatever the width (backward ~ 4 b W^2 depth flops,
    the gradient 4 W^2 depth bytes). A CPU core (~1e10-1e11 flop/s) against gloo on CPU (~1 GB/s)
    is there at b = 32; a GPU (~6.7e13 fp32 flop/s on an H200) against gloo through host memory
    (~1.7 GB/s, and the GPU's time shared by the ranks) needs thousands of rows: b = 8192, and 4096
    with a GPU per rank and NCCL.
    """
    if not getattr(route, "on_gpu", False):
        if quick:
            return ExperimentPlan((1, 4), 32, (0.5, 2), 6, 2, "CPU: one core per rank; small models keep it quick")
        return ExperimentPlan((2, 8, 32, 64), 32, (1, 4, 16, 64), 20, 3,
                              "CPU: one core per rank, a batch of 32 rows per rank")
    batch = 8192 if route.shares_gpu else 4096
    why = (f"GPU: compute takes microseconds per row, so {batch} rows per rank give a backward pass of "
           "milliseconds, comparable to the all-reduce")
    if quick:
        return ExperimentPlan((4, 16), batch // 4, (1, 4), 6, 2, why)
    return ExperimentPlan((2, 8, 32, 64), batch, (1, 4, 16, 64), 20, 3, why)


# --- one configuration of the step ------------------------------------------------------------

@dataclass(frozen=True)
class StepConfig:
    """One measured run: the model, the per-rank batch, the way it runs, and how many steps.

    `steps` timed steps follow `warmup` untimed ones; with `min_time_s` > 0 rank 0 raises
    `steps` (up to `max_steps`) so the timed part lasts about that long, and tells every rank.
    """

    width: int
    depth: int = 4
    batch_per_rank: int = 32
    mode: str = "ddp"
    bucket_cap_mb: float = 25.0
    steps: int = 10
    warmup: int = 2
    min_time_s: float = 0.0
    max_steps: int = 200
    lr: float = 1e-3
    seed: int = 0

    def __post_init__(self):
        check_choice("mode", self.mode, MODES)
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
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.zeros(sum(p.numel() for p in params), device=device)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def _agree_steps(cfg: StepConfig, device: str, warm_step_s: float) -> int:
    """Rank 0 decides how many steps to time and broadcasts it: every rank runs the same count.

    min(max_steps, max(steps, ceil(min_time_s / warm_step_s))) with `min_time_s` > 0, else `steps`.
    """
    longest = cfg.max_steps if cfg.min_time_s > 0 else cfg.steps
    return agree_iters(max(warm_step_s, 1e-6) * 1e3, cfg.min_time_s * 1e3, cfg.steps, longest, device)


class _Step:
    """The model, optimizer and this rank's batch for one StepConfig, and the step itself."""

    def __init__(self, cfg: StepConfig, ctx):
        import torch

        self.cfg, self.device, self.world = cfg, ctx.device, ctx.world_size
        model = build_mlp(cfg.width, cfg.depth, cfg.seed).to(ctx.device)
        x, y = synthetic_batch(cfg.batch_per_rank * ctx.world_size, cfg.width, cfg.seed + 1)
        part = rank_slice(len(x), ctx.rank, ctx.world_size)
        self.x, self.y = x[part].to(ctx.device), y[part].to(ctx.device)
        self.flat = _flat_gradients(model, ctx.device) if cfg.mode == "no_overlap" else None
        if cfg.mode == "single":
            self.model = model
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [torch.device(ctx.device).index] if ctx.device.startswith("cuda") else None
            # DDP: gradients live in its buckets (no copy in or out), as no-overlap's live in the flat buffer
            self.model = DDP(model, device_ids=ids, bucket_cap_mb=cfg.bucket_cap_mb,
                             gradient_as_bucket_view=cfg.mode == "ddp")
        self.opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        self.params = list(model.parameters())

    def loss(self):
        import torch

        return torch.nn.functional.mse_loss(self.model(self.x), self.y)

    def run(self, timer) -> None:
        """One training step; each part inside `timer.section(name)` (`timer` may be None)."""
        import contextlib

        sec = timer.section if timer else (lambda name: contextlib.nullcontext())
        self.gradients(sec)
        with sec("optimizer_ms"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=False)  # keep the gradients inside their buffers

    def gradients(self, sec) -> None:
        """Forward, backward and (DDP inside backward, or after it) the gradient all-reduce."""
        import contextlib

        import torch.distributed as dist

        from labutils.timing import barrier

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
        from labutils.timing import SectionTimer

        timer = SectionTimer(self.device)
        with self.model.no_sync():
            loss = self.loss()
            with timer.section("backward"):
                loss.backward()
        ms = timer.totals_ms()["backward"]
        self.opt.zero_grad(set_to_none=False)
        return ms


def _time_one_step(step: _Step, ddp_reference: bool) -> dict:
    """Time one step with the ranks lined up (timing.line_up: barrier, then one untimed step
    when ranks communicate); returns its parts in ms."""
    from labutils.timing import SectionTimer, line_up

    line_up(step.device, (lambda: step.run(None)) if step.cfg.mode != "single" else None)
    timer = SectionTimer(step.device)
    with timer.section("step_ms"):
        step.run(timer)
    row = {name: 0.0 for name in SECTIONS}
    row.update(timer.totals_ms())
    if step.cfg.mode == "no_overlap":
        row["exposed_comm_ms"] = row["wait_ms"] + row["allreduce_ms"]
    elif ddp_reference:
        row["backward_compute_ms"] = step.backward_without_sync_ms()
        row["exposed_comm_ms"] = max(0.0, row["backward_ms"] - row["backward_compute_ms"])
    else:
        row["exposed_comm_ms"] = 0.0 if step.cfg.mode == "single" else math.nan
    return row


def _flat_allreduce_ms(step: _Step, reps: int = 3) -> float:
    """Median time of one all-reduce of the whole gradient, on this run's link (ms)."""
    import torch
    import torch.distributed as dist

    from labutils.timing import time_loop

    buf = torch.zeros(sum(p.numel() for p in step.params), device=step.device)
    return float(np.median([time_loop(lambda: dist.all_reduce(buf), 1, step.device) for _ in range(reps)]))


def _mean_over_ranks(rows: list[dict], device: str) -> list[dict]:
    """Every rank's per-step rows, averaged over ranks; `step_max_ms` is the slowest rank's step."""
    import torch
    import torch.distributed as dist

    keys = sorted(rows[0])
    dev = device if device.startswith("cuda") else "cpu"
    t = torch.tensor([[r[k] for k in keys] for r in rows], dtype=torch.float64, device=dev)
    steps = t[:, keys.index("step_ms")].clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    t = (t / dist.get_world_size()).cpu().numpy()
    out = [dict(zip(keys, map(float, vals))) for vals in t]
    for row, slowest in zip(out, steps.cpu().tolist()):
        row["step_max_ms"] = float(slowest)
    return out


def _check_world(cfg: StepConfig, world_size: int) -> None:
    if cfg.mode == "single" and world_size != 1:
        raise LabInputError(f"mode 'single' runs on one rank, not {world_size}")
    if cfg.mode != "single" and world_size < 2:
        raise LabInputError(f"mode {cfg.mode!r} needs at least 2 ranks, got {world_size}")


def _warm_up(step: _Step, warmup: int) -> float:
    """Run `warmup` untimed steps (at least one: DDP settles its buckets in the first); seconds per step."""
    import time

    from labutils.timing import synchronize

    started = time.perf_counter()
    for _ in range(max(1, warmup)):
        step.run(None)
    synchronize(step.device)
    return (time.perf_counter() - started) / max(1, warmup)


def train_worker(ctx, configs: list[StepConfig], ddp_reference: bool = True, interleave: bool = True) -> list[dict]:
    """Run the StepConfigs on this rank; return one row per timed step (means over ranks).

    With `interleave`, all configurations are built and warmed up first, then timed in rounds
    (one step of each per round), so a change in the machine's load touches them all alike;
    else one after the other. Every rank makes the same collective calls in the same order:
    step counts come from rank 0, each step starts after a barrier, rows are averaged at the end.
    """
    rows = []
    groups = [list(enumerate(configs))] if interleave else [[pair] for pair in enumerate(configs)]
    for group in groups:
        steps, counts = {}, {}
        for index, cfg in group:
            _check_world(cfg, ctx.world_size)
            steps[index] = _Step(cfg, ctx)
            counts[index] = _agree_steps(cfg, ctx.device, _warm_up(steps[index], cfg.warmup))
        timed = {index: [] for index in steps}
        for r in range(max(counts.values())):
            for index, step in steps.items():
                if r < counts[index]:
                    timed[index].append(_time_one_step(step, ddp_reference and step.cfg.mode == "ddp"))
            ctx.report({"done": r + 1, "of": max(counts.values())})
        for index, step in steps.items():
            rows += _finish_rows(step, _mean_over_ranks(timed[index], ctx.device), index, ctx)
    return rows


def _finish_rows(step: _Step, timed: list[dict], index: int, ctx) -> list[dict]:
    """Label one configuration's rows with its settings; `other_ms` makes the parts add up."""
    cfg = step.cfg
    flat_ms = _flat_allreduce_ms(step) if cfg.mode == "ddp" else math.nan
    for i, row in enumerate(timed):
        row.update(asdict(cfg), run=index, step=i, world_size=ctx.world_size, backend=ctx.backend,
                   device=ctx.device.split(":")[0], gradient_bytes=cfg.gradient_bytes,
                   global_batch=cfg.batch_per_rank * ctx.world_size, flat_allreduce_ms=flat_ms)
        row["other_ms"] = row["step_ms"] - sum(row[k] for k in SECTIONS)
    return timed


# --- running it from the notebook, the CLI or a benchmark -----------------------------------------

THREADS_PER_RANK = 1  # every rank, the one-rank baseline included: one "device" = one core here


def measure(configs: list[StepConfig], nproc: int, backend: str = "auto", device: str = "auto",
            timeout_s: float = 600.0, progress: bool = True, ddp_reference: bool = True,
            interleave: bool = True) -> pd.DataFrame:
    """Run `configs` on `nproc` ranks in one launch; one row per timed step (times in ms, rank means).

    `interleave` times the configurations in rounds, one step of each (see `train_worker`); it
    keeps every model in memory at once.

    On CPU every rank gets `THREADS_PER_RANK` thread(s), the one-rank run too: N ranks then use N
    cores and one rank one core, so the speedup compares one worker with N workers, as one GPU
    with N GPUs, and not one rank that may use every core with N ranks that share them.
    """
    return _launch(configs, nproc, backend, device, timeout_s, progress, ddp_reference, interleave)[0]


def _launch(configs, nproc, backend, device, timeout_s, progress, ddp_reference=True, interleave=True,
            contention: dict | None = None) -> tuple[pd.DataFrame, dict | None]:
    """One launch of `configs` (and, when `contention` gives its model, the contention probe after
    them): (steps frame, probe result or None)."""
    from labutils.launch import launch, resolve_backend
    from labutils.progress import rank_progress

    nproc = check_int("nproc", nproc, low=1)
    if not configs:
        raise LabInputError("configs is empty: give at least one StepConfig")
    choice = resolve_backend(backend, device, nproc)
    with rank_progress(max(c.steps for c in configs), f"{nproc} rank(s), {choice.backend}/{choice.device}",
                       progress, unit="step") as on_report:
        results = launch(_run_worker, nproc, args=(list(configs),),
                         kwargs={"ddp_reference": ddp_reference, "interleave": interleave, "contention": contention},
                         backend=choice.backend, device=choice.device, timeout_s=timeout_s,
                         threads_per_rank=THREADS_PER_RANK, on_report=on_report)
    return pd.DataFrame(results[0]["rows"]), results[0]["contention"]


def _run_worker(ctx, configs, ddp_reference: bool = True, interleave: bool = True,
                contention: dict | None = None) -> dict:
    """`train_worker`, then (with `contention`) `contention_worker`, in the same ranks."""
    rows = train_worker(ctx, configs, ddp_reference, interleave)
    probe = contention_worker(ctx, **contention) if contention else None
    return {"rows": rows, "contention": probe}


# --- why the bounds hold, or not: backward and the all-reduce, alone and together ----------------

def contention_worker(ctx, width: int, depth: int = 4, batch_per_rank: int = 32, reps: int = 5) -> dict:
    """Time, on every rank, backward alone, one all-reduce of a gradient-sized buffer alone, and the
    two together (the all-reduce started asynchronously just before backward, waited for after).

    Ideal overlap makes "together" the longer of the two; sharing the same cores (the CPU route:
    gloo's threads and backward run on the ranks' cores) makes it their sum or more. Median over
    `reps` aligned repetitions (one untimed first); each figure is the slowest rank's (ms).
    """
    import torch
    import torch.distributed as dist

    from labutils.timing import SectionTimer, barrier, synchronize

    model = build_mlp(width, depth).to(ctx.device)
    x, y = synthetic_batch(batch_per_rank * ctx.world_size, width, 1)
    part = rank_slice(len(x), ctx.rank, ctx.world_size)
    x, y = x[part].to(ctx.device), y[part].to(ctx.device)
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


def contention_table(probe: dict) -> pd.DataFrame:
    """The probe as a small table (ms): backward alone, the all-reduce alone, both together, against
    ideal overlap (the longer of the two) and no overlap at all (their sum); `together / sum` near or
    above 1 says the two did not overlap: they shared the same cores."""
    b, c, both = probe["backward_ms"], probe["allreduce_ms"], probe["together_ms"]
    rows = [("backward alone", b), ("all-reduce alone", c), ("both together, measured", both),
            ("ideal overlap: max(backward, all-reduce)", max(b, c)), ("no overlap: backward + all-reduce", b + c)]
    table = pd.DataFrame(rows, columns=["what", "ms"]).set_index("what")
    table["vs no overlap"] = table["ms"] / (b + c)
    return table


def overlap_verdict(probe: dict, margin: float = 0.9) -> str:
    """One sentence from the probe: did backward and the all-reduce overlap?

    `together` at or above `margin` x (backward + all-reduce) means they ran one after the other
    (or got in each other's way); near max(backward, all-reduce) means they overlapped.
    """
    b, c, both = probe["backward_ms"], probe["allreduce_ms"], probe["together_ms"]
    hidden = (b + c - both) / min(b, c) if min(b, c) > 0 else 0.0
    if both >= margin * (b + c):
        return (f"No overlap: together {both:.3g} ms against {b:.3g} + {c:.3g} = {b + c:.3g} ms one after the "
                f"other ({both / (b + c):.0%} of the sum). Backward and the all-reduce shared the same cores, so "
                "the ideal-overlap bound does not apply here.")
    return (f"Overlap: together {both:.3g} ms, below the sum {b + c:.3g} ms; {max(0.0, min(1.0, hidden)):.0%} of the "
            f"shorter part was hidden (ideal: {max(b, c):.3g} ms).")


def _p(q):
    def f(s):
        return float(np.nanpercentile(s, q)) if s.notna().any() else math.nan
    f.__name__ = f"p{q}"
    return f


SUMMARY_KEYS = ["run", "mode", "world_size", "width", "depth", "batch_per_rank", "global_batch",
                "bucket_cap_mb", "gradient_bytes", "backend", "device"]
TIME_COLUMNS = ["step_ms", "step_max_ms", *SECTIONS, "exposed_comm_ms", "other_ms"]


def summarize(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per run: median, p10 and p90 over the timed steps of every time column (ms)."""
    cols = [c for c in TIME_COLUMNS + ["backward_compute_ms", "flat_allreduce_ms"] if c in steps]
    keys = [k for k in SUMMARY_KEYS if k in steps]
    stats = steps.groupby(keys, dropna=False)[cols].agg(["median", _p(10), _p(90)])
    stats.columns = [c if s == "median" else f"{c}_{s}" for c, s in stats.columns]
    out = stats.reset_index()
    out["steps"] = steps.groupby(keys, dropna=False).size().to_numpy()
    out["compute_ms"] = out["forward_ms"] + out["backward_ms"] + out["optimizer_ms"]
    if "backward_compute_ms" in out:  # for DDP: compute is backward without the sync
        ddp = out["backward_compute_ms"].notna()
        out.loc[ddp, "compute_ms"] = (out["forward_ms"] + out["backward_compute_ms"] + out["optimizer_ms"])[ddp]
    return out


# --- prediction: pure functions (ms, bytes, decimal GB/s) --------------------------------------------

@dataclass(frozen=True)
class StepPrediction:
    """Predicted N-rank step (ms): `no_overlap_ms` (sum bound) >= measured >= `overlap_ms` (max bound)."""

    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    comm_ms: float
    buckets: int

    @property
    def compute_ms(self) -> float:
        return self.forward_ms + self.backward_ms + self.optimizer_ms

    @property
    def no_overlap_ms(self) -> float:
        """compute + comm: nothing hidden."""
        return self.compute_ms + self.comm_ms

    @property
    def overlap_ms(self) -> float:
        """forward + max(backward, comm) + optimizer: all comm hidden behind backward if it fits."""
        return self.forward_ms + max(self.backward_ms, self.comm_ms) + self.optimizer_ms


def predict_step(single_row, world_size: int, busbw_GBps: float, alpha_us: float = 0.0,
                 buckets: int = 1) -> StepPrediction:
    """The N-rank step from a one-rank summary row (its medians) and the link's alpha and busbw."""
    comm = predict_comm_ms(single_row["gradient_bytes"], world_size, busbw_GBps, alpha_us, buckets)
    return StepPrediction(float(single_row["forward_ms"]), float(single_row["backward_ms"]),
                          float(single_row["optimizer_ms"]), float(comm), int(buckets))


def bucket_comm_ms(sweep: pd.DataFrame, bucket_bytes) -> tuple[float, CurvePrediction]:
    """The all-reduce time of a step's buckets read off the measured sweep, in ms: the sum over
    buckets of the measured curve interpolated at each bucket's size (`fit.interpolate_time_us`).
    The sweep must have run on the step's rank count. Returns (ms, the per-bucket reading)."""
    from labutils.fit import interpolate_time_us

    reading = interpolate_time_us(sweep, list(bucket_bytes))
    return float(np.sum(reading.time_us)) / 1e3, reading


def is_between(measured_ms: float, prediction: StepPrediction) -> bool:
    """Ideal overlap <= measured <= no overlap: the step lies between its two bounds."""
    return prediction.overlap_ms <= measured_ms <= prediction.no_overlap_ms


def bounds_compute(route) -> str:
    """Where the bounds take compute from on `route` (a machine.Route): "n_rank" (the N-rank run's
    own backward without sync) when ranks share a GPU, whose compute then runs at a fraction of
    the one-rank speed; else "one_rank" (a true prediction from one rank)."""
    return "n_rank" if getattr(route, "shares_gpu", False) else "one_rank"


def bounds_expected(route) -> bool:
    """Should the measured DDP step lie between the bounds on `route`? Yes on a GPU, where the
    compute runs on the GPU and the all-reduce elsewhere (gloo's CPU threads, or NCCL's own
    kernels beside backward), so overlap is real. Not on the CPU route: backward and gloo's
    threads share the ranks' cores (`contention_worker` shows it with numbers)."""
    return bool(getattr(route, "on_gpu", False))


def between_bounds_figure(table: pd.DataFrame) -> str:
    """"k/n": of the n DDP runs with default buckets in a `prediction_table`, k lay between the bounds."""
    ddp = table[(table["mode"] == "ddp") & (table["bucket_cap_mb"] == DEFAULT_BUCKET_MB)]
    return f"{int(ddp['between'].sum())}/{len(ddp)}"


def predicted_efficiency(gradient_bytes, busbw_GBps, compute_ms, world_size, alpha_us=0.0, buckets=1,
                         hideable=0.0, scaling="weak"):
    """Predicted scaling efficiency (0..1) of an N-rank data-parallel step; numpy-vectorised.

    `compute_ms` is the one-rank step at the per-rank batch (weak) or at the global batch
    (strong: each rank then computes compute_ms / N). A share `hideable` (0..1) of the compute,
    the backward pass, can hide communication: T_N = (1 - h) c + max(h c, comm).
    weak: efficiency = compute_ms / T_N;  strong: efficiency = compute_ms / (N T_N).
    hideable=0 is the no-overlap (sum) bound, hideable=1 the max bound.
    """
    check_range("compute_ms", compute_ms, low=0, low_open=True, unit="ms")
    check_range("hideable", hideable, low=0, high=1)
    check_choice("scaling", scaling, ("weak", "strong"))
    n = np.asarray(world_size, dtype=float)
    c = np.asarray(compute_ms, dtype=float) / (n if scaling == "strong" else 1.0)
    h = np.asarray(hideable, dtype=float)
    comm = predict_comm_ms(gradient_bytes, n, busbw_GBps, alpha_us, buckets)
    t_n = (1 - h) * c + np.maximum(h * c, comm)
    eff = np.asarray(compute_ms, float) / ((n if scaling == "strong" else 1.0) * t_n)
    return float(eff) if np.ndim(eff) == 0 else eff


def min_busbw_for_efficiency(gradient_bytes, compute_ms, world_size, efficiency=0.9, alpha_us=0.0, buckets=1):
    """Smallest bus bandwidth (GB/s) for a weak-scaling efficiency without overlap, or inf ("never").

    E = c / (c + comm)  =>  comm <= c (1/E - 1); the wire part 2(N-1)/N V / (B 1e6) must fit in what
    is left after the latency, so B >= 2(N-1)/N V / (1e6 (c (1/E - 1) - buckets alpha / 1e3)).
    """
    check_range("efficiency", efficiency, low=0, high=1, low_open=True)
    room_ms = np.asarray(compute_ms, float) * (1 / np.asarray(efficiency, float) - 1) \
        - np.asarray(buckets, float) * np.asarray(alpha_us, float) / 1e3
    need = bus_factor("all_reduce", world_size) * np.asarray(gradient_bytes, float) / 1e6
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where(room_ms > 0, need / np.where(room_ms > 0, room_ms, 1.0), math.inf)
    bw = np.where(need == 0, 0.0, bw)
    return float(bw) if bw.ndim == 0 else bw


# --- the experiments of notebook 08 ----------------------------------------------------------------

DEFAULT_BUCKET_MB = 25.0  # DDP's default bucket_cap_mb


@dataclass(frozen=True)
class DataParallelRun:
    """What `scaling_experiment` measured: the `summary` (one row per run, ms) and the `contention`
    probe on N ranks (`contention_worker`, None when not asked for)."""

    summary: pd.DataFrame
    contention: dict | None = None


def scaling_experiment(widths, depth: int = 4, batch_per_rank: int = 32, nproc: int = 2, steps: int = 10,
                       warmup: int = 2, bucket_caps_mb=(), bucket_width: int | None = None,
                       backend: str = "auto", device: str = "auto", min_time_s: float = 0.0,
                       timeout_s: float = 600.0, progress: bool = True, contention: bool = True) -> DataParallelRun:
    """Measure each model (one per width) every way; the summary, one row per run (ms).

    One launch of 1 rank: each model at the per-rank batch b (weak-scaling baseline) and at the
    global batch N b (strong-scaling baseline). One launch of N ranks at b per rank: DDP with the
    default 25 MiB buckets and the no-overlap variant for each model, then DDP at each of
    `bucket_caps_mb` for the model of `bucket_width` (default: the widest), then (`contention`) the
    contention probe on the widest model.
    """
    widths = [int(w) for w in np.atleast_1d(widths)]
    bucket_width = bucket_width or max(widths)
    singles, many = [], []
    for width in widths:
        base = StepConfig(width, depth, batch_per_rank, "single", DEFAULT_BUCKET_MB, steps, warmup, min_time_s)
        singles += [base, replace(base, batch_per_rank=batch_per_rank * nproc)]
        many += [replace(base, mode="ddp"), replace(base, mode="no_overlap")]
    base = replace(many[0], width=bucket_width, mode="ddp")
    many += [replace(base, bucket_cap_mb=float(c)) for c in bucket_caps_mb if float(c) != DEFAULT_BUCKET_MB]
    probe = {"width": max(widths), "depth": depth, "batch_per_rank": batch_per_rank} if contention else None
    one = summarize(measure(singles, 1, backend, device, timeout_s, progress))
    steps_n, found = _launch(many, nproc, backend, device, timeout_s, progress, contention=probe)
    n = summarize(steps_n)
    n["run"] += len(one)
    return DataParallelRun(pd.concat([one, n], ignore_index=True), found)


def _single(summary: pd.DataFrame, run: pd.Series, batch: int) -> pd.Series:
    """The one-rank run of the same model as `run`, at `batch`."""
    rows = summary[(summary["mode"] == "single") & (summary["batch_per_rank"] == batch)
                   & (summary["width"] == run["width"]) & (summary["depth"] == run["depth"])]
    if rows.empty:
        raise LabInputError(f"the summary has no one-rank run of width {run['width']} at batch {batch}")
    return rows.iloc[0]


def scaling_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Speedup and efficiency of each N-rank run with default buckets, weak and strong scaling.

    weak (same b per rank):      speedup = N T1(b) / TN(b) (samples per second), efficiency = T1(b) / TN(b)
    strong (same global batch):  speedup = T1(N b) / TN(b),                        efficiency = speedup / N
    """
    rows = []
    runs = summary[(summary["mode"] != "single") & (summary["bucket_cap_mb"] == DEFAULT_BUCKET_MB)]
    for _, run in runs.iterrows():
        n, b = int(run["world_size"]), int(run["batch_per_rank"])
        for kind, batch in (("weak", b), ("strong", n * b)):
            t1 = float(_single(summary, run, batch)["step_ms"])
            speedup = (n * t1 if kind == "weak" else t1) / run["step_ms"]
            rows.append({"mode": run["mode"], "gradient_bytes": run["gradient_bytes"], "scaling": kind,
                         "world_size": n, "one_rank_batch": batch, "one_rank_ms": t1, "n_rank_ms": run["step_ms"],
                         "speedup": speedup, "efficiency": speedup / n})
    return pd.DataFrame(rows)


def _own_compute(run: pd.Series) -> dict:
    """The N-rank run's own compute medians (ms): DDP's backward without sync, or no-overlap's backward."""
    backward = run["backward_compute_ms"] if run["mode"] == "ddp" else run["backward_ms"]
    return {"gradient_bytes": run["gradient_bytes"], "forward_ms": run["forward_ms"], "backward_ms": backward,
            "optimizer_ms": run["optimizer_ms"]}


def prediction_table(summary: pd.DataFrame, busbw_GBps: float, alpha_us: float,
                     compute: str = "one_rank", sweep: pd.DataFrame | None = None) -> pd.DataFrame:
    """Predicted bounds against the measured step for every N-rank run (ms).

    compute="one_rank": forward, backward and optimizer from the one-rank run of the same model at
    the same per-rank batch (a true prediction). compute="n_rank": from the N-rank run itself
    (backward without sync), which keeps what sharing the machine did to compute and tests only
    the communication model. DDP all-reduces in `mlp_bucket_sizes` buckets, the no-overlap
    variant in one.

    The all-reduce: with `sweep` (a measured all_reduce sweep on the same rank count, covering the
    buckets' sizes) each bucket's time is read off the measured curve (`bucket_comm_ms`);
    `comm_line_ms` is the alpha-beta line's figure beside it, and `extrapolated` flags runs with a
    bucket outside the measured range. Without `sweep` the line is the prediction.

    `between`: overlap bound <= measured <= no-overlap bound; errors are |predicted - measured| /
    measured. `comm_measured_ms` (no-overlap runs) is the all-reduce alone and `wait_ms` the wait
    for the slowest rank, which the bounds leave out.
    """
    check_choice("compute", compute, ("one_rank", "n_rank"))
    runs = summary[summary["mode"] != "single"]
    if sweep is not None and set(sweep["world_size"]) != set(runs["world_size"]):
        raise LabInputError(f"the sweep ran on {sorted(set(sweep['world_size']))} ranks but the steps on "
                            f"{sorted(set(runs['world_size']))}: read the curve of the same rank count")
    rows = []
    for _, run in runs.iterrows():
        width, depth, n = int(run["width"]), int(run["depth"]), int(run["world_size"])
        sizes = [int(run["gradient_bytes"])] if run["mode"] == "no_overlap" else \
            mlp_bucket_sizes(width, depth, run["bucket_cap_mb"])
        source = _single(summary, run, int(run["batch_per_rank"])) if compute == "one_rank" else _own_compute(run)
        line = predict_step(source, n, busbw_GBps, alpha_us, len(sizes))
        pred, extrapolated = line, False
        if sweep is not None:
            comm, reading = bucket_comm_ms(sweep, sizes)
            pred, extrapolated = replace(line, comm_ms=comm), reading.any_extrapolated
        measured = float(run["step_ms"])
        comm_measured = run["allreduce_ms"] if run["mode"] == "no_overlap" else math.nan
        rows.append({"run": run["run"], "mode": run["mode"], "bucket_cap_mb": run["bucket_cap_mb"],
                     "gradient_bytes": run["gradient_bytes"], "buckets": len(sizes), "compute_ms": pred.compute_ms,
                     "backward_ms": pred.backward_ms, "comm_pred_ms": pred.comm_ms, "comm_line_ms": line.comm_ms,
                     "extrapolated": extrapolated, "comm_measured_ms": comm_measured, "wait_ms": run["wait_ms"],
                     "no_overlap_pred_ms": pred.no_overlap_ms,
                     "overlap_pred_ms": pred.overlap_ms, "measured_ms": measured,
                     "error_no_overlap": abs(pred.no_overlap_ms - measured) / measured,
                     "error_overlap": abs(pred.overlap_ms - measured) / measured,
                     "between": is_between(measured, pred)})
    return pd.DataFrame(rows)


def time_breakdown(summary: pd.DataFrame) -> pd.DataFrame:
    """Where the median step went, per run (ms); the columns add up to `step_ms` exactly.

    DDP's backward holds its exposed communication (waiting for the slowest rank included): it
    is split into compute and exposed comm. The no-overlap variant times the wait on its own.
    """
    out = pd.DataFrame(index=summary.index)
    out["label"] = [f"{format_size(r['gradient_bytes'])} grad, {r['mode']}, {r['world_size']} rank(s), "
                    f"b={r['batch_per_rank']}" + (f", {r['bucket_cap_mb']:g} MiB buckets" if r["mode"] == "ddp" else "")
                    for _, r in summary.iterrows()]
    ddp = (summary["mode"] == "ddp").to_numpy()
    exposed = summary["exposed_comm_ms"].fillna(0.0)
    out["forward"] = summary["forward_ms"]
    out["backward"] = np.where(ddp, summary["backward_ms"] - exposed, summary["backward_ms"])
    out["wait for slowest rank"] = np.where(ddp, 0.0, summary["wait_ms"])
    out["exposed comm"] = np.where(ddp, exposed, summary["allreduce_ms"])
    out["optimizer"] = summary["optimizer_ms"]
    out["other"] = summary["step_ms"] - out[["forward", "backward", "wait for slowest rank", "exposed comm",
                                             "optimizer"]].sum(axis=1)
    out["step_ms"] = summary["step_ms"]
    return out.set_index("label")


# --- correctness: DDP gradients equal one-rank gradients ---------------------------------------------

def reference_gradient(width: int, depth: int, global_batch: int, seed: int = 0) -> np.ndarray:
    """The flat float64 gradient of one process on the whole global batch (MSE loss, mean)."""
    import torch

    model = build_mlp(width, depth, seed)
    x, y = synthetic_batch(global_batch, width, seed + 1)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).double().numpy()


def gradient_worker(ctx, width: int, depth: int, batch_per_rank: int,
                    runs=(("ddp", 0), ("no_overlap", 0)), seed: int = 0) -> dict:
    """This rank's flat gradient after one synchronised backward on its slice of the global batch.

    `runs` lists (mode, train_steps): a fresh model per run, `train_steps` full training steps
    first (replicas that drifted apart would show in the gradient). Returns {(mode, steps): array}.
    """
    import contextlib

    import torch

    out = {}
    for mode, train_steps in runs:
        step = _Step(StepConfig(width, depth, batch_per_rank, mode, seed=seed, lr=0.1), ctx)
        for _ in range(train_steps):
            step.run(None)
        step.gradients(lambda name: contextlib.nullcontext())
        out[(mode, train_steps)] = torch.cat([p.grad.flatten() for p in step.params]).double().cpu().numpy()
    return out


# --- exercises ----------------------------------------------------------------------------------------------

def max_hidden_gradient_bytes(backward_ms, busbw_GBps, world_size, alpha_us=0.0, buckets=1):
    """The largest gradient whose all-reduce fits behind the backward pass (ideal overlap), bytes.

    comm = buckets alpha + 2(N-1)/N V / (B 1e6) <= backward  =>  V <= (backward - buckets alpha / 1e3) B 1e6 / (2(N-1)/N).
    Unlimited (inf) for N = 1; 0 when the latencies alone outlast backward.
    """
    room_ms = np.maximum(0.0, np.asarray(backward_ms, float) - np.asarray(buckets, float) * np.asarray(alpha_us, float) / 1e3)
    factor = bus_factor("all_reduce", world_size)
    with np.errstate(divide="ignore"):
        out = np.where(factor > 0, room_ms * np.asarray(busbw_GBps, float) * 1e6 / np.where(factor > 0, factor, 1), math.inf)
    return float(out) if out.ndim == 0 else out


