"""Data parallelism by hand (notebook 11): the gradient all-reduce of notebook 10 built four ways,
checked against torch's DistributedDataParallel and timed beside it; reduce-scatter and all-gather
as collectives; and one ZeRO-style step (gradients reduce-scattered, Adam on a 1/N shard, parameters
all-gathered) checked against DDP's update.

Each way is a function `way(model, comm) -> finish`: it may register gradient hooks on the model
(they run during backward), and returns `finish()`, run after backward, which leaves every
`p.grad` holding the mean over ranks. A step is: forward, backward, finish(), optimizer.

- `per_parameter` (a): after backward, one all-reduce per parameter;
- `flat` (b):          after backward, every gradient in one buffer, one all-reduce;
- `overlapped` (c):    each parameter's all-reduce launched asynchronously from its
                       post-accumulate-grad hook, while backward computes the earlier layers;
- `bucketed` (d):      parameters packed in reverse order into `Bucket`s of about `bucket_mb` MiB
                       (`bucket_assignment`, DDP's packing); `bucket_hook` copies each gradient into
                       its bucket and launches the bucket's all-reduce once the bucket is full.

`Comm` makes the collectives and logs each (op, elements): every rank must log the same list.
The model and batch are notebook 10's (`ddp_step.build_mlp`, `ddp_step.rank_batch`); the ranks are
the kernel's shared pool (`pool.shared_pool`). The arithmetic (sizes, estimates, memory) is
`labutils.model.ddp_hand`.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from labutils.core.busbw import binary_size
from labutils.core.inputs import check_int, check_range
from labutils.experiments.ddp_step import build_mlp, ddp_cap_mb, rank_batch
from labutils.measure.launch import resolve_backend
from labutils.measure.pool import shared_pool
from labutils.measure.timing import SectionTimer, across_ranks, agree_reps, barrier, group_size, round_s
from labutils.model.ddp_hand import WAYS, step_estimates_ms, way_allreduce_bytes, way_comm_ms
from labutils.model.fit import allreduce_ms
from labutils.model.sizing import plan_reps

GRAD_TOLERANCE = 1e-5  # float32: the ways against DDP, largest relative difference allowed
PARTS = ("forward_ms", "backward_ms", "comm_ms", "optimizer_ms")


class Comm:
    """This rank's collectives, each logged as (op, elements) in `log`."""

    def __init__(self):
        self.world = group_size()
        self.log: list[tuple[str, int]] = []

    def all_reduce(self, t, async_op: bool = False):
        self.log.append(("all_reduce", t.numel()))
        return dist.all_reduce(t, async_op=async_op)

    def reduce_scatter(self, out, inp):
        self.log.append(("reduce_scatter", inp.numel()))
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp)

    def all_gather(self, out, inp):
        self.log.append(("all_gather", out.numel()))
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp)


# --- the four ways ----------------------------------------------------------------------------------


def per_parameter(model, comm: Comm):
    """(a) After backward: one all-reduce per parameter, in `model.parameters()` order, then / N."""
    params = list(model.parameters())

    def finish():
        for p in params:
            comm.all_reduce(p.grad)
            p.grad.div_(comm.world)
    return finish


def flat(model, comm: Comm):
    """(b) After backward: every gradient copied into one flat buffer, ONE all-reduce, copied back / N."""
    params = list(model.parameters())

    def finish():
        buffer = torch.cat([p.grad.reshape(-1) for p in params])
        comm.all_reduce(buffer)
        buffer.div_(comm.world)
        for p, g in zip(params, buffer.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
    return finish


def overlapped(model, comm: Comm):
    """(c) During backward: a hook on each parameter launches its gradient's all-reduce (async_op)
    as soon as backward has accumulated it; finish() waits for them all, then / N."""
    launched = []

    def hook(p):
        launched.append((p, comm.all_reduce(p.grad, async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p, work in launched:
            work.wait()
            p.grad.div_(comm.world)
        launched.clear()
    return finish


class Bucket:
    """Parameters whose gradients travel in one all-reduce: the flat `buffer`, each parameter's
    `slot(p)` in it (a view), how many gradients are `ready`, and the `work` of its launched
    all-reduce (None until launched)."""

    def __init__(self, params, device):
        self.params = list(params)
        self.buffer = torch.zeros(sum(p.numel() for p in self.params), device=device)
        self._start, offset = {}, 0
        for p in self.params:
            self._start[p], offset = offset, offset + p.numel()
        self.ready, self.work = 0, None

    def slot(self, p):
        return self.buffer[self._start[p]:self._start[p] + p.numel()].view_as(p)

    def full(self) -> bool:
        return self.ready == len(self.params)


def bucket_assignment(params, bucket_bytes: float) -> list[list]:
    """Parameters in reverse order (backward's), packed greedily: a bucket closes once it holds at
    least `bucket_bytes` (DDP's packing; `ddp_model.ddp_bucket_sizes` gives the same sizes)."""
    buckets, current, filled = [], [], 0
    for p in reversed(list(params)):
        current.append(p)
        filled += p.numel() * p.element_size()
        if filled >= bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
    return buckets + ([current] if current else [])


def bucket_hook(bucket: Bucket, param, comm: Comm) -> None:
    """The reference hook: the gradient into its slot; the bucket's all-reduce launched, without
    waiting, once its last gradient is in."""
    bucket.slot(param).copy_(param.grad)
    bucket.ready += 1
    if bucket.full():
        bucket.work = comm.all_reduce(bucket.buffer, async_op=True)


def bucketed(model, comm: Comm, bucket_mb: float = 1.0, hook=bucket_hook):
    """(d) During backward: `hook(bucket, p, comm)` runs as each gradient is accumulated (it fills
    the bucket and launches its all-reduce when full); finish() waits for every bucket, then copies
    each slot / N back into its `p.grad` and empties the buckets for the next step."""
    device = next(model.parameters()).device
    buckets = [Bucket(ps, device) for ps in bucket_assignment(model.parameters(), bucket_mb * 2**20)]
    for b in buckets:
        for p in b.params:
            p.register_post_accumulate_grad_hook(lambda p, b=b: hook(b, p, comm))

    def finish():
        for b in buckets:
            if b.work is not None:
                b.work.wait()
            b.buffer.div_(comm.world)
            for p in b.params:
                p.grad.copy_(b.slot(p))
            b.ready, b.work = 0, None
    return finish


# --- one model copy, its way and its step, inside a rank ---------------------------------------------


@dataclass(frozen=True)
class Model:
    """The lab's MLP (notebook 10's) and the batch rows per rank."""

    width: int = 512
    depth: int = 4
    batch_per_rank: int = 32
    bucket_mb: float = 1.0
    seed: int = 0


def load_hook(source: str, name: str):
    """A student's hook from its source text (a function in a notebook cannot be pickled to a rank)."""
    space = {"torch": torch, "dist": dist}
    exec(compile(source, f"<{name}>", "exec"), space)  # noqa: S102 - the student's own cell, in their own ranks
    return space[name]


class Replica:
    """One model copy on this rank with its way ("local": no communication, "ddp": torch's DDP at
    the same bucket cap, "student": `bucketed` with the student's hook), SGD or Adam, and its batch."""

    def __init__(self, way: str, m: Model, ctx, hook=None, adam: bool = False, lr: float = 1e-3):
        model = build_mlp(m.width, m.depth, m.seed, ctx.device)
        self.x, self.y = rank_batch(m.batch_per_rank, m.width, ctx.rank, m.seed + 1, ctx.device)
        self.comm, self.finish, self.net = Comm(), (lambda: None), model
        if way == "ddp":
            ids = [torch.device(ctx.device).index] if ctx.device.startswith("cuda") else None
            self.net = DDP(model, device_ids=ids, bucket_cap_mb=ddp_cap_mb(m.bucket_mb))
        elif way in ("bucketed", "student"):
            self.finish = bucketed(model, self.comm, m.bucket_mb, hook or bucket_hook)
        elif way != "local":
            self.finish = {"per_parameter": per_parameter, "flat": flat, "overlapped": overlapped}[way](model,
                                                                                                    self.comm)
        self.params = list(model.parameters())
        self.opt = (torch.optim.Adam if adam else torch.optim.SGD)(self.params, lr=lr)

    def backward(self, sec) -> None:
        with sec("forward_ms"):
            loss = torch.nn.functional.mse_loss(self.net(self.x), self.y)
        with sec("backward_ms"):
            loss.backward()
        with sec("comm_ms"):  # what is left of the communication after backward
            self.finish()

    def step(self, timer=None) -> None:
        sec = timer.section if timer else _no_section
        self.backward(sec)
        with sec("optimizer_ms"):
            self.opt.step()
            self.opt.zero_grad()

    def gradients(self) -> list:
        """One forward and backward with the way's communication: the gradients, cloned; then zeroed."""
        self.backward(_no_section)
        grads = [p.grad.detach().clone() for p in self.params]
        self.opt.zero_grad()
        return grads


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _no_section(name):
    return _Nothing()


def rel_diff(mine, theirs) -> float:
    """The largest ||a - b|| / ||b|| over a list of tensors."""
    return max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(mine, theirs))


# --- the workers ------------------------------------------------------------------------------------


def check_worker(ctx, ways, m: Model, hook_source: tuple[str, str] | None = None) -> dict:
    """One step of DDP and of each way from the same weights and batch: each way's gradients against
    DDP's (`rel_diff`) and the collectives it made. Nothing follows the last way's step (the
    student's, when given): a hook that leaves a rank waiting in a collective hangs that rank alone,
    and the launcher's deadline names it."""
    reference = Replica("ddp", m, ctx).gradients()
    hook = load_hook(*hook_source) if hook_source else None
    out = {}
    for way in ways:
        replica = Replica(way, m, ctx, hook if way == "student" else None)
        out[way] = {"rel_diff": rel_diff(replica.gradients(), reference), "calls": list(replica.comm.log)}
    return out


def time_worker(ctx, ways, m: Model, budget_s: float, warmup: int = 2, min_reps: int = 5, max_reps: int = 200,
                hook_source: tuple[str, str] | None = None) -> list[dict]:
    """Time the ways, DDP and "local" (compute alone) in interleaved rounds, one step of each per
    round after a barrier; as many rounds as fit `budget_s` (counted from the call's start; rank
    0's plan broadcast, `timing.agree_reps`). One row per way: the median of each part over the
    rounds, mean over ranks, and the slowest rank's median step (`step_max_ms`)."""
    started = time.perf_counter()
    hook = load_hook(*hook_source) if hook_source else None
    replicas = {w: Replica(w, m, ctx, hook if w == "student" else None) for w in ("local", *ways, "ddp")}
    for replica in replicas.values():
        for _ in range(max(1, warmup)):
            replica.step()
    probe_s = round_s(lambda: [r.step() for r in replicas.values()], ctx.device)
    left_s = max(0.0, budget_s - (time.perf_counter() - started))
    plan = agree_reps([plan_reps(probe_s, left_s, min_reps, max_reps)], ctx.device)[0]
    samples = {w: [] for w in replicas}
    for i in range(plan.reps):
        for way, replica in replicas.items():
            barrier(ctx.device)
            timer = SectionTimer(ctx.device)
            with timer.section("step_ms"):
                replica.step(timer)
            samples[way].append(timer.totals_ms())
        ctx.report({"done": i + 1, "of": plan.reps})
    rows = []
    for way, got in samples.items():
        row = {"way": way, "reps": plan.reps, "budget_cut": plan.budget_cut}
        for key in ("step_ms", *PARTS):
            stats = across_ranks(statistics.median(s.get(key, 0.0) for s in got), ctx.device)
            row[key] = stats.mean
            if key == "step_ms":
                row["step_max_ms"] = stats.max
        rows.append(row)
    return rows


# --- launching them, from the notebook, the grader and the tests -------------------------------------


def _pool(nproc: int, backend: str, device: str):
    choice = resolve_backend(backend, device, check_int("nproc", nproc, low=2))
    return shared_pool(nproc, choice.backend, choice.device)


def check_ways(m: Model, nproc: int = 2, backend: str = "auto", device: str = "auto", ways=WAYS,
               timeout_s: float = 300.0, hook_source=None) -> pd.DataFrame:
    """`check_worker` on `nproc` ranks: one row per way, the largest relative gradient difference
    against DDP over ranks and parameters, the all-reduces of rank 0, and `same_calls` (every rank
    logged the same collectives)."""
    results = _pool(nproc, backend, device).run(check_worker, args=(list(ways), m),
                                                kwargs={"hook_source": hook_source}, timeout_s=timeout_s)
    return calls_frame(results, ways)


def calls_frame(results: list[dict], ways) -> pd.DataFrame:
    """The check's rows from every rank's results (see `check_ways`)."""
    rows = []
    for way in ways:
        calls = results[0][way]["calls"]
        rows.append({"way": way, "max_rel_diff": max(r[way]["rel_diff"] for r in results),
                     "all_reduces": sum(op == "all_reduce" for op, _ in calls),
                     "bytes": 4 * sum(n for _, n in calls), "same_calls": all(r[way]["calls"] == calls
                                                                            for r in results),
                     "calls": calls})
    frame = pd.DataFrame(rows).set_index("way")
    frame["matches_ddp"] = frame["max_rel_diff"] < GRAD_TOLERANCE
    return frame


def time_ways(m: Model, budget_s: float, nproc: int = 2, backend: str = "auto", device: str = "auto", ways=WAYS,
              timeout_s: float = 300.0, hook_source=None, min_reps: int = 5) -> pd.DataFrame:
    """`time_worker` on `nproc` ranks: one row per way, "local" and "ddp" (ms, see there)."""
    check_range("budget_s", budget_s, low=0, unit="s")
    rows = _pool(nproc, backend, device).run(time_worker, args=(list(ways), m, float(budget_s)),
                                             kwargs={"hook_source": hook_source, "min_reps": min_reps},
                                             timeout_s=timeout_s)[0]
    return pd.DataFrame(rows).set_index("way")


def estimates_table(times: pd.DataFrame, m: Model, nproc: int, link) -> pd.DataFrame:
    """Each way's step (and DDP's) against its two estimates from `link` (alpha + bytes / busbw per
    all-reduce, `model.ddp_hand`) and the run's own compute ("local": forward, backward, optimizer
    without communication). `error_no_overlap` = |estimate - measured| / measured; `position`:
    below the ideal-overlap estimate, between the two, or above the no-overlap one."""
    local, rows = times.loc["local"], []
    for way in [w for w in times.index if w != "local"]:
        name = "bucketed" if way == "student" else way
        comm = way_comm_ms(name, m.width, m.depth, m.bucket_mb, nproc, link.busbw_GBps, link.alpha_us)
        no_overlap, ideal = step_estimates_ms(name, local["forward_ms"], local["backward_ms"],
                                              local["optimizer_ms"], comm)
        measured = float(times.loc[way, "step_ms"])
        rows.append({"way": way, "all_reduces": len(way_allreduce_bytes(name, m.width, m.depth, m.bucket_mb)),
                     "comm_est_ms": comm, "ideal_overlap_est_ms": ideal, "no_overlap_est_ms": no_overlap,
                     "measured_ms": measured, "exposed_after_backward_ms": float(times.loc[way, "comm_ms"]),
                     "error_no_overlap": abs(no_overlap - measured) / measured,
                     "position": "below" if measured < ideal else "above" if measured > no_overlap else "between"})
    return pd.DataFrame(rows).set_index("way")


def ways_sentence(table: pd.DataFrame) -> str:
    """The fastest and slowest way measured, (d) against (b) and against torch's DDP, and where the
    steps fell against their estimates, all from the numbers."""
    mine = table.drop(index=[w for w in ("ddp", "student") if w in table.index])
    fast, slow = mine["measured_ms"].idxmin(), mine["measured_ms"].idxmax()
    d, b, ddp = (float(table.loc[w, "measured_ms"]) for w in ("bucketed", "flat", "ddp"))
    counts = table["position"].value_counts()
    where = ", ".join(f"{int(counts[p])} {p}" for p in ("below", "between", "above") if p in counts)
    return (f"Fastest of the four: {fast} ({mine.loc[fast, 'measured_ms']:.3g} ms); slowest: {slow} "
            f"({mine.loc[slow, 'measured_ms']:.3g} ms). Buckets took {d / b:.2f}x the flat all-reduce's step and "
            f"{d / ddp:.2f}x torch DDP's ({ddp:.3g} ms): " + _than(d, ddp, "DDP") + ". Against the estimates "
            f"(below the ideal-overlap one, between, above the no-overlap one): {where}, of {len(table)} steps.")


def _than(mine: float, theirs: float, who: str, tol: float = 0.05) -> str:
    if abs(mine / theirs - 1) <= tol:
        return f"as fast as {who} (within {tol:.0%})"
    return f"faster than {who}" if mine < theirs else f"slower than {who}"


# --- reduce-scatter + all-gather against all-reduce --------------------------------------------------


def rs_ag_table(frame: pd.DataFrame, link=None) -> pd.DataFrame:
    """From a sweep of all_reduce, reduce_scatter and all_gather (`sweep.run_sweep(op=...)`, nccl-tests'
    bus factors: 2(N-1)/N, (N-1)/N, (N-1)/N): per size, each time (us) and busbw, reduce-scatter +
    all-gather, and all-reduce over their sum; with `link`, rs + ag estimated as 2 x (alpha +
    (N-1)/N x bytes / busbw) and its error."""
    t = frame.pivot_table(index="size_bytes", columns="op", values=["time_us", "busbw_GBps"])
    out = pd.DataFrame(index=t.index)
    for op, short in (("all_reduce", "ar"), ("reduce_scatter", "rs"), ("all_gather", "ag")):
        out[f"{short}_us"], out[f"{short}_busbw_GBps"] = t[("time_us", op)], t[("busbw_GBps", op)]
    out["rs_plus_ag_us"] = out["rs_us"] + out["ag_us"]
    out["ar_over_rs_ag"] = out["ar_us"] / out["rs_plus_ag_us"]
    if link is not None:
        n = int(frame["world_size"].iloc[0])
        # one phase of the ring is half an all-reduce: half its wire time, and one fixed cost
        out["rs_plus_ag_est_us"] = [2e3 * (allreduce_ms(s, n, link.busbw_GBps) / 2 + link.alpha_us / 1e3)
                                    for s in out.index]
        out["est_error"] = (out["rs_plus_ag_est_us"] - out["rs_plus_ag_us"]).abs() / out["rs_plus_ag_us"]
    out.index = [binary_size(s) for s in out.index]
    out.index.name = "size"
    return out


def rs_ag_sentence(table: pd.DataFrame) -> str:
    """All-reduce against reduce-scatter + all-gather at the largest size, from the numbers."""
    big = table.iloc[-1]
    ratio = float(big["ar_over_rs_ag"])
    verdict = ("about the same time as" if abs(ratio - 1) <= 0.1 else
               "less time than" if ratio < 1 else "more time than")
    return (f"At {table.index[-1]} one all-reduce took {big['ar_us'] / 1e3:.3g} ms, {verdict} a reduce-scatter "
            f"({big['rs_us'] / 1e3:.3g} ms) followed by an all-gather ({big['ag_us'] / 1e3:.3g} ms): "
            f"{ratio:.2f}x their sum. "
            f"busbw: all-reduce {big['ar_busbw_GBps']:.3g}, reduce-scatter {big['rs_busbw_GBps']:.3g}, all-gather "
            f"{big['ag_busbw_GBps']:.3g} GB/s.")


# --- the sharded (ZeRO-style) step --------------------------------------------------------------------


class ShardedAdam:
    """ZeRO-style Adam for `model` on this rank: the parameters live in one flat buffer padded to N
    equal shards (the model's tensors become views into it). step(): the full gradient, as backward
    made it, is reduce-scattered (rank r keeps the sum of shard r, / N), Adam updates shard r with
    moments held for shard r only, and the shards are all-gathered back into the buffer. Adam as
    torch.optim.Adam computes it (bias-corrected, eps outside the square root)."""

    def __init__(self, model, comm: Comm, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.comm, self.lr, self.betas, self.eps = list(model.parameters()), comm, lr, betas, eps
        total = sum(p.numel() for p in self.params)
        self.k = math.ceil(total / comm.world)
        self.flat = torch.zeros(self.k * comm.world, device=self.params[0].device)
        offset = 0
        for p in self.params:
            self.flat[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
            p.data = self.flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.rank = dist.get_rank()
        self.grad = torch.zeros(self.k, device=self.flat.device)
        self.m, self.v, self.t = torch.zeros_like(self.grad), torch.zeros_like(self.grad), 0

    def step(self) -> None:
        full = torch.zeros_like(self.flat)
        full[:sum(p.numel() for p in self.params)] = torch.cat([p.grad.reshape(-1) for p in self.params])
        for p in self.params:
            p.grad = None  # the full gradient is not kept: only this rank's shard of it
        self.comm.reduce_scatter(self.grad, full)
        del full
        self.grad.div_(self.comm.world)
        (b1, b2), self.t = self.betas, self.t + 1
        self.m.lerp_(self.grad, 1 - b1)
        self.v.mul_(b2).addcmul_(self.grad, self.grad, value=1 - b2)
        denom = (self.v.sqrt() / math.sqrt(1 - b2 ** self.t)).add_(self.eps)
        mine = self.flat[self.rank * self.k:(self.rank + 1) * self.k]
        mine.addcdiv_(self.m, denom, value=-self.lr / (1 - b1 ** self.t))
        self.comm.all_gather(self.flat, mine.clone())

    def held_bytes(self) -> dict[str, int]:
        """The tensors this rank holds (bytes): the flat parameters, the gradient shard, the moments."""
        return {"parameters": _nbytes(self.flat), "gradients": _nbytes(self.grad),
                "Adam moments": _nbytes(self.m) + _nbytes(self.v)}


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def sharded_worker(ctx, m: Model, steps: int = 2, lr: float = 1e-3) -> dict:
    """`steps` Adam steps with DDP (torch.optim.Adam) and with `ShardedAdam` from the same weights:
    the largest relative difference of the updates (parameters after minus before), the sharded
    step's collectives, the tensors each holds (bytes) and, on CUDA, each one's peak allocation."""
    on_cuda = ctx.device.startswith("cuda")
    peak = {}
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    ddp = Replica("ddp", m, ctx, adam=True, lr=lr)
    before = [p.detach().clone() for p in ddp.params]
    for _ in range(steps):
        ddp.backward(_no_section)
        grads = sum(_nbytes(p.grad) for p in ddp.params)
        ddp.opt.step()
        ddp.opt.zero_grad()
    moments = sum(_nbytes(s[k]) for s in ddp.opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
    ddp_held = {"parameters": sum(_nbytes(p) for p in ddp.params), "gradients": grads, "Adam moments": moments}
    ddp_update = [p.detach() - b for p, b in zip(ddp.params, before)]
    if on_cuda:
        peak["DDP"] = torch.cuda.max_memory_allocated()
        del ddp
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    mine = Replica("local", m, ctx)
    zero = ShardedAdam(mine.net, mine.comm, lr)
    for _ in range(steps):
        mine.backward(_no_section)
        zero.step()
    update = [p.detach() - b for p, b in zip(mine.params, before)]
    if on_cuda:
        peak["sharded"] = torch.cuda.max_memory_allocated()
    return {"rel_diff": rel_diff(update, ddp_update), "calls": list(mine.comm.log), "ddp_held": ddp_held,
            "sharded_held": zero.held_bytes(), "peak_bytes": peak}


@dataclass(frozen=True)
class ShardedCheck:
    """The sharded step against DDP's: `rel_diff` (largest over ranks), `same_calls`, `calls` (rank
    0's), `held` (tensor bytes per rank, DDP and sharded, rank 0's), `peak_bytes` (CUDA, else {})."""

    rel_diff: float
    same_calls: bool
    calls: list
    held: pd.DataFrame
    peak_bytes: dict

    @property
    def equal(self) -> bool:
        return self.rel_diff < GRAD_TOLERANCE and self.same_calls


def check_sharded(m: Model, nproc: int = 2, backend: str = "auto", device: str = "auto", steps: int = 2,
                  timeout_s: float = 300.0) -> ShardedCheck:
    """`sharded_worker` on `nproc` ranks."""
    results = _pool(nproc, backend, device).run(sharded_worker, args=(m, check_int("steps", steps, low=1)),
                                                timeout_s=timeout_s)
    held = pd.DataFrame({"DDP (bytes)": results[0]["ddp_held"], "sharded (bytes)": results[0]["sharded_held"]})
    held.loc["total"] = held.sum()
    return ShardedCheck(max(r["rel_diff"] for r in results), all(r["calls"] == results[0]["calls"] for r in results),
                        results[0]["calls"], held, results[0]["peak_bytes"])


def sharded_sentence(check: ShardedCheck, table: pd.DataFrame, nproc: int) -> str:
    """The sharded step's update against DDP's, its two collectives against DDP's all-reduce, and the
    memory table (`model.ddp_hand.memory_table`) against the tensors the ranks held."""
    same = (table[["DDP (bytes)", "sharded (bytes)"]].to_numpy() == check.held.to_numpy()).all()
    ops = " + ".join(f"{op.replace('_', '-')} of {binary_size(4 * n)}" for op, n in check.calls[:2])
    text = (f"The sharded update {'equals' if check.equal else 'differs from'} DDP's (largest relative difference "
            f"{check.rel_diff:.1e}, tolerance {GRAD_TOLERANCE:g}); per step each rank made {ops}, "
            f"{'the same calls on every rank' if check.same_calls else 'NOT the same calls on every rank'}. "
            f"Per rank it holds {table.loc['total', 'sharded / DDP']:.2f}x DDP's bytes on {nproc} ranks; the "
            f"table {'matches' if same else 'does NOT match'} the tensors the ranks held.")
    if check.peak_bytes:
        text += (f" Peak CUDA allocation per rank: DDP {binary_size(check.peak_bytes['DDP'])}, sharded "
                 f"{binary_size(check.peak_bytes['sharded'])} (activations and temporary buffers included).")
    return text


def summary_figures(check: pd.DataFrame, table: pd.DataFrame, rs_ag: pd.DataFrame) -> dict:
    """The figures notebook 11 records, {key: (value, unit, label)}: the worst gradient difference,
    (d) over torch DDP, all-reduce over rs + ag at the largest size, and the estimates' errors."""
    ms, rs_err = table["measured_ms"], rs_ag["est_error"].iloc[-1] if "est_error" in rs_ag else math.nan
    return {"ddp_hand_max_grad_rel_diff": (float(check["max_rel_diff"].max()), "",
                                           "worst relative gradient difference of the four ways against torch DDP"),
            "ddp_hand_bucketed_over_torch": (float(ms["bucketed"] / ms["ddp"]), "x",
                                             "step of the buckets by hand over torch DDP's, same bucket size"),
            "allreduce_over_rs_ag": (float(rs_ag["ar_over_rs_ag"].iloc[-1]), "x",
                                     f"all-reduce over reduce-scatter + all-gather at {rs_ag.index[-1]}B"),
            "ddp_hand_no_overlap_error": (float(np.median(table.loc[["per_parameter", "flat"], "error_no_overlap"])),
                                          "", "median |estimate - measured| / measured, (a) and (b)"),
            "rs_ag_estimate_error": (float(rs_err), "", "|estimate - measured| / measured, rs + ag, largest size")}


def check_sentence(check: pd.DataFrame) -> str:
    """Whether every way's gradients equal DDP's and every rank made the same calls, from the check."""
    bad = [w for w in check.index if not (check.loc[w, "matches_ddp"] and check.loc[w, "same_calls"])]
    counts = ", ".join(f"{w} {int(check.loc[w, 'all_reduces'])}" for w in check.index)
    head = (f"All {len(check)} ways equal torch DDP's gradients" if not bad else
            f"{', '.join(bad)} do NOT equal torch DDP's gradients or made different calls on different ranks")
    return (f"{head} (worst relative difference {check['max_rel_diff'].max():.1e}, tolerance {GRAD_TOLERANCE:g}). "
            f"All-reduces per step: {counts}; each way sends the same {binary_size(check['bytes'].iloc[0])}.")
