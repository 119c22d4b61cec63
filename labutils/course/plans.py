"""Each notebook's plan: how its time budget is shared out, and what it runs on a given machine.

Every measuring notebook has a `budget_s` parameter: the seconds its measurements may take, the
same on any machine (`budget_s(quick)`: 40 s in full mode, 12 s in quick mode). `Budget(name,
budget_s)` hands it out over the notebook's experiments; each experiment then fits its
repetitions to its share (labutils.model.sizing).

`notebook_plan(name, machine, params)` is the same notebook seen by the run-time model
(labutils.model.run_time): its rank sets, calls, figures and, per measurement, the predicted
round at each size. Sizes come from labutils.model.sizing, as the notebooks choose them, and the
other settings from the notebook's own `parameters` cell (`params`, runner.notebook_parameters),
so the prediction follows the notebooks as they change. Assumed: notebook 02 has saved a sweep
and a link before 05, 09 and 10 run (the course order), so they measure none of their own.
"""

from __future__ import annotations

from labutils.core.busbw import sweep_sizes
from labutils.core.inputs import LabInputError
from labutils.course.machine import SHARES, budget_seconds
from labutils.model import sizing
from labutils.model.fit import allreduce_ms
from labutils.model.run_time import Machine, Measurement, NotebookPlan, predict

# --- the notebooks as the run-time model sees them ------------------------------------------------

def _sweep(what: str, machine: Machine, share_s: float, max_bytes: int, nproc: int, alpha_us: float,
           busbw_GBps: float) -> Measurement:
    """A sweep 1 KiB .. `max_bytes` (x2): a round per size is one all-reduce, plus the check; the
    sweep's 5 warm-up calls (SweepConfig's, in both modes) and 3..1000 calls per size."""
    sizes = sweep_sizes(1024, max_bytes, 2)
    rounds = tuple(2 * allreduce_ms(s, nproc, busbw_GBps, alpha_us) / 1e3 + machine.call_s / 10 for s in sizes)
    return Measurement(what, rounds, share_s, warmup=5, min_reps=3, max_reps=1000)


def _cpu_link(machine: Machine) -> tuple[float, float]:
    """gloo across CPU processes on this machine: the route's own link on a CPU-only machine, else
    a server's loopback (about 60 us, 5 GB/s)."""
    return (machine.alpha_us, machine.busbw_GBps) if machine.route == "cpu" else (60.0, 5.0)


def notebook_plan(name: str, machine: Machine, params: dict) -> NotebookPlan:
    """The plan of notebook `name` on `machine` with the parameters `params` (its parameters cell
    with any overrides; `quick` and `budget_s` among them)."""
    quick = bool(params.get("quick", False))
    budget = budget_seconds(quick, params.get("budget_s"))
    frac = SHARES.get(name, {})
    nproc = int(params.get("nproc") or 2)
    rates = machine.rates(2)
    if name == "00_check_your_machine":
        return NotebookPlan(name, budget, rank_sets=1 if params.get("ping_gloo", True) else 0, calls=1, figures=0,
                            fixed_s=0.5)
    if name == "01_topology":
        copies = 0.0
        if machine.gpus:
            size, iters = 256 * 2**20, int(params.get("copy_iters") or 20)
            pairs = machine.gpus * (machine.gpus - 1)
            copies = iters * size * (2 * machine.gpus / 25e9 + pairs / max(machine.busbw_GBps * 1e9, 25e9))
        return NotebookPlan(name, budget, rank_sets=0, calls=0, figures=4, fixed_s=1.5 + copies)
    if name == "02_allreduce_sweep":
        max_bytes = 4 << 20 if quick else 64 << 20
        # without a sweep beside it (CPU; quick mode on a GPU) the main sweep takes the whole budget
        sweeps = [_sweep("sweep", machine, frac["sweep"], max_bytes, nproc, machine.alpha_us, machine.busbw_GBps)]
        beside = machine.route != "cpu" and not quick  # on another set of ranks, started inside the budget
        if beside:
            alpha, busbw = _cpu_link(machine) if machine.route == "one-gpu" else (machine.alpha_us * 4, 2.0)
            sweeps.append(_sweep("sweep beside", machine, frac["sweep beside"], max_bytes, nproc, alpha, busbw))
        # calls: the one all-reduce by hand and the sweep, the same two beside
        return NotebookPlan(name, budget, rank_sets=1 + beside, calls=2 + 2 * beside, figures=4,
                            measurements=tuple(sweeps), fixed_s=1.0)
    if name == "03_nccl_transports":
        # the NCCL_DEBUG capture (full mode, several GPUs): one tiny sweep on ranks of its own environment
        capture = machine.route == "multi-gpu" and not quick
        return NotebookPlan(name, budget, rank_sets=int(capture), calls=int(capture), figures=0, fixed_s=0.5)
    if name == "04_ring_by_hand":
        alpha, busbw = _cpu_link(machine)
        sizes = [4096, 262144, 4194304] if quick else params.get("sizes") or [4096, 65536, 1048576, 4194304, 16777216]
        n = int(params.get("nproc") or 4)
        rounds = tuple(4 * (2 * (n - 1) * alpha * 1e-6 + 2 * (n - 1) / n * s / (busbw * 1e9)) for s in sizes)
        # calls: the correctness check (it starts the ranks, before the share is taken), then the timing
        return NotebookPlan(name, budget, rank_sets=1, calls=2, figures=3,
                            measurements=(Measurement("hand ring", rounds, frac["hand ring"], 1, 1, 500),),
                            fixed_s=0.5)
    if name == "05_predicting_allreduce":  # the fit drawn, and the per-N prediction
        return NotebookPlan(name, budget, rank_sets=0, calls=0, figures=2, fixed_s=0.5)
    if name == "06_tensor_parallel":
        b, h = sizing.compute_size(machine.flops_per_s)  # sized from rank 0's rate measured alone (its calls: 4)
        rounds = (sizing.layer_round_s(b, h, ("whole", "split"), rates),)
        return NotebookPlan(name, budget, rank_sets=1, calls=4, figures=1, fixed_s=1.0,
                            measurements=(Measurement("one split step", rounds, frac["one split step"],
                                                      *sizing.LAYER_REPS[quick]),))
    if name == "07_backward_and_precision":  # the precision study runs in the kernel; three checks on ranks
        return NotebookPlan(name, budget, rank_sets=1, calls=3, figures=1, fixed_s=1.0)
    if name == "08_time_budget":
        return NotebookPlan(name, budget, rank_sets=0, calls=0, figures=5, fixed_s=1.0)
    if name == "09_validating_the_budget":
        layers = sizing.layer_plan(rates, quick)
        def rounds(modes, sizes, chunks=(1,)):
            return tuple(sizing.layer_round_s(b, h, modes, rates, 2, chunks) for b, h in sizes)
        reps = sizing.LAYER_REPS[quick]
        ms = (Measurement("before the split", rounds(("whole", "halves"), layers.sizes), frac["before the split"],
                          *reps),
              Measurement("the split", rounds(("whole", "split", "replica"), layers.sizes), frac["the split"], *reps),
              Measurement("overlap", rounds(("whole", "overlap"), [layers.overlap_size], layers.chunk_counts),
                          frac["overlap"], *reps))
        step = sizing.layer_round_s(*layers.overlap_size, ("overlap",), rates, 2, (max(layers.chunk_counts),))
        return NotebookPlan(name, budget, rank_sets=1, calls=5, figures=3, measurements=ms, fixed_s=0.5 + 10 * step)
    if name == "10_data_parallel_training":
        depth = int(params.get("depth") or 4)
        # sized after the ranks started (the GEMM probe runs on them): from the budget then left
        plan = sizing.ddp_plan(rates, quick, max(1.0, budget - machine.startup_s), depth, nproc)
        b = plan.batch_per_rank
        one = tuple(sizing.ddp_step_s(w, depth, k * b, rates, 1) for w in plan.widths for k in (1, nproc))
        ref = {w: sizing.ddp_step_s(w, depth, b, rates, 1) for w in plan.widths}  # DDP's reference backward
        many = tuple(2 * sizing.ddp_step_s(w, depth, b, rates, nproc) + ref[w] * (k == 0)  # a line-up step each
                     for w in plan.widths for k in range(2))
        many += tuple(2 * sizing.ddp_step_s(plan.widths[-1], depth, b, rates, nproc) + ref[plan.widths[-1]]
                      for _ in plan.bucket_caps_mb)
        probe = (3 * sizing.ddp_step_s(plan.widths[-1], depth, b, rates, nproc),)  # backward, all-reduce, both
        reps = (plan.warmup + 1, plan.steps, plan.max_steps)  # building a model costs about a step
        runs = len(one) + len(many)  # scaling_experiment shares its budget by runs
        ms = (Measurement("one rank", one, frac["steps"] * len(one) / runs, *reps, drops=False),
              Measurement("N ranks", many, frac["steps"] * len(many) / runs, *reps, drops=False),
              Measurement("contention", probe, 0.0, 0, 5, 5, drops=False))  # a fixed 5 rounds, outside the budget
        return NotebookPlan(name, budget, rank_sets=1, calls=5, figures=4, measurements=ms,
                            fixed_s=0.5 + 5 * plan.widest_step_s)
    if name == "11_ddp_by_hand":
        width, depth = int(params.get("width") or (256 if quick else 512)), int(params.get("depth") or 4)
        b = int(params.get("batch_per_rank") or 32)
        comm_s = allreduce_ms(4 * width * width * depth, nproc, machine.busbw_GBps, machine.alpha_us) / 1e3
        step = sizing.ddp_step_s(width, depth, b, rates, nproc) + comm_s
        ways = Measurement("four ways", (6 * step,), frac["four ways"], 2 + 1, 5, 200)  # local, a-d, DDP; +1: building
        high = 4 << 20 if quick else 16 << 20  # the three collectives, 64 KiB .. high (x4)
        sizes = [s for s in sweep_sizes(65536, high, 4)]
        coll = tuple(3 * allreduce_ms(s, nproc, machine.busbw_GBps, machine.alpha_us) / 1e3 + machine.call_s / 10
                     for s in sizes)
        # the checks (four ways, sharded step, the exercise's stub): a few steps each, outside the budget
        return NotebookPlan(name, budget, rank_sets=1, calls=5, figures=0, fixed_s=0.5 + 20 * step,
                            measurements=(ways, Measurement("collectives", coll, frac["collectives"], 5, 3, 1000)))
    raise LabInputError(f"notebook {name!r} is not one of the course's")


def predicted_seconds(machine: Machine, params_by_notebook: dict[str, dict]) -> dict[str, float]:
    """{notebook: predicted seconds} for every notebook given with its parameters."""
    return {name: predict(machine, notebook_plan(name, machine, p)).total_s for name, p in params_by_notebook.items()}
