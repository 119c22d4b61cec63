"""Workers that only tests spawn, fault injection among them. Spawned ranks import them as
`rank_workers` (pytest puts tests/ on sys.path, and the spawn start method hands sys.path to the
children)."""

import contextlib
import os
import time

import torch
import torch.distributed as dist

from labutils.experiments import tensor_parallel as tp
from labutils.experiments.ddp_step import RankStep, StepConfig, build_mlp, synthetic_batch
from labutils.measure import buffers
from labutils.measure.harness import sweep_worker
from labutils.measure.launch import ping_worker, preflight_all_reduce
from labutils.measure.timing import across_ranks, agree_iters, agree_reps, barrier, group_size
from labutils.model.sizing import plan_reps


def gradient_worker(ctx, width: int, depth: int, batch_per_rank: int,
                    runs=(("ddp", 0), ("no_overlap", 0)), seed: int = 0) -> dict:
    """This rank's flat gradient after one synchronised backward on its slice of the global batch.

    `runs` lists (mode, train_steps): a fresh model per run, `train_steps` full training steps
    first (replicas that drifted apart would show in the gradient). Returns {(mode, steps): array}.
    """
    out = {}
    for mode, train_steps in runs:
        step = RankStep(StepConfig(width, depth, batch_per_rank, mode, seed=seed, lr=0.1), ctx)
        for _ in range(train_steps):
            step.run(None)
        step.gradients(lambda name: contextlib.nullcontext())
        out[(mode, train_steps)] = torch.cat([p.grad.flatten() for p in step.params]).double().cpu().numpy()
    return out


def weights_worker(ctx, hidden: int = 32, ffn: int = 128, seed: int = 5) -> dict:
    """This rank's full MLP weights as the split layer draws them: checksum, dtype, device, and
    whether a second call came from the rank's cache (the same tensor object)."""
    w = tp.mlp_weights(hidden, ffn, seed, "float32", ctx.device)
    again = tp.mlp_weights(hidden, ffn, seed, "float32", ctx.device)
    return {"rank": ctx.rank, "checksum": tp.weights_checksum(w), "dtype": str(w.W1.dtype),
            "device": str(w.W1.device), "cached": again.W1 is w.W1, "first": float(w.W1[0, 0])}


def reference_gradient(width: int, depth: int, global_batch: int, seed: int = 0):
    """The flat float64 gradient of one process on the whole global batch (MSE loss, mean): what
    every rank's synchronised gradient must equal."""
    model = build_mlp(width, depth, seed)
    x, y = synthetic_batch(global_batch, width, seed + 1)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).double().numpy()


def affinity_worker(ctx) -> dict:
    """What this rank was given: its CPU set (`os.sched_getaffinity` of the calling thread),
    torch's thread count, and the CPUs gloo's threads (pt_gloo_runloop, gloo_tcp_loop) may use."""
    gloo: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                if "gloo" in fh.read():
                    gloo |= os.sched_getaffinity(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return {"rank": ctx.rank, "cpus": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
            "gloo_thread_cpus": sorted(gloo)}


# --- fault injection: a rank that raises, hangs, crashes or returns wrong elements ---------------------------

FAULTS = ("raise", "hang", "crash", "corrupt")


def misbehave(ctx, fault_rank: int, fault: str) -> None:
    """On rank `fault_rank`: "raise" a RuntimeError, "hang" (sleep an hour), "crash" (exit status 17), or
    "corrupt": from now on every checked collective call adds 1 to the first 3 elements of its result."""
    assert fault in FAULTS, fault
    if ctx.rank != fault_rank:
        return
    if fault == "raise":
        raise RuntimeError(f"injected failure on rank {ctx.rank}")
    if fault == "hang":
        time.sleep(3600)
    if fault == "crash":
        os._exit(17)
    if fault == "corrupt":
        real = buffers.collective_call  # count_wrong's call; the timed calls (harness) keep their own

        def corrupting(lay, inp, out):
            call = real(lay, inp, out)

            def wrong():
                call()
                out.view(-1)[:3] += 1
            return wrong
        buffers.collective_call = corrupting


def faulty_ping_worker(ctx, fault_rank: int, fault: str) -> dict:
    """`launch.ping_worker` in which rank `fault_rank` misbehaves (see `misbehave`)."""
    misbehave(ctx, fault_rank, fault)
    return ping_worker(ctx)


def solo_worker(ctx) -> dict:
    """What a rank sees of its world, after a barrier, agree_iters, agree_reps and across_ranks
    (which must return without the other ranks when it works alone)."""
    barrier(ctx.device)
    iters = agree_iters(2.0, 10.0, 1, 100, ctx.device)
    reps = agree_reps([plan_reps(0.1, 1.0, 2, 50)], ctx.device)[0].reps
    stats = across_ranks(float(ctx.rank + 3), ctx.device)
    return {"rank": ctx.rank, "world_size": ctx.world_size, "group_size": group_size(), "pid": os.getpid(),
            "iters": iters, "reps": reps, "mean": stats.mean}


def faulty_sweep_worker(ctx, fault_rank: int, fault: str, **sweep_kwargs) -> list[dict]:
    """`harness.sweep_worker` in which rank `fault_rank` misbehaves (see `misbehave`)."""
    misbehave(ctx, fault_rank, fault)
    return sweep_worker(ctx, **sweep_kwargs)


# --- the preflight: a rank that stalls before its all-reduce, or a link that never completes one ------------

def stalled_preflight(ctx, stage, stall_rank: int) -> None:
    """`launch.preflight_all_reduce`, but rank `stall_rank` stalls (sleeps an hour) before reaching it."""
    if ctx.rank == stall_rank:
        time.sleep(3600)
    preflight_all_reduce(ctx, stage)


def hung_link_preflight(ctx, stage) -> None:
    """Every rank reaches the preflight's all-reduce and none completes (a GPU link that hangs)."""
    stage("all_reduce")
    time.sleep(3600)


# --- a shim that records every collective a worker makes ---------------------------------------------------

COLLECTIVES = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "send",
               "recv", "isend", "irecv", "all_gather_object", "broadcast_object_list")


def _tensor_devices(value) -> list[str]:
    if isinstance(value, torch.Tensor):
        return [str(value.device)]
    if isinstance(value, (list, tuple)):
        return [d for v in value for d in _tensor_devices(v)]
    return []


def recording_worker(ctx, worker, *args, **kwargs) -> dict:
    """Run `worker(ctx, *args, **kwargs)` with every torch.distributed collective wrapped to record
    (name, devices of its tensors, barrier's device_ids) in call order; returns {"calls", "result"}."""
    calls = []

    def wrap(name, real):
        def recorded(*a, **kw):
            calls.append((name, tuple(_tensor_devices(list(a) + list(kw.values()))), kw.get("device_ids")))
            return real(*a, **kw)
        return recorded

    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    for name, real in saved.items():
        setattr(dist, name, wrap(name, real))
    try:
        result = worker(ctx, *args, **kwargs)
    finally:
        for name, real in saved.items():
            setattr(dist, name, real)
    return {"calls": calls, "result": result, "device": ctx.device}


def bucket_layout_worker(ctx, width: int, depth: int, caps: list) -> dict:
    """The bytes of each bucket DDP really built for the lab's MLP at each cap, after three steps
    (DDP rebuilds its buckets after the first): {cap: [bytes, ...]}, in the order DDP reduces them."""
    out = {}
    for cap in caps:
        step = RankStep(StepConfig(width, depth, 4, "ddp", cap, steps=1, warmup=0), ctx)
        for _ in range(3):
            step.run(None)
        out[cap] = [b.buffer().numel() * b.buffer().element_size()
                    for b in step.model.reducer._get_zeros_like_grad_buckets()]
    return out
