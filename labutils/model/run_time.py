"""How long a notebook runs on a machine: a pure model, so that "every notebook finishes in bounded
time" can be checked for machines this lab has never run on. No torch, no files.

A machine (`Machine`) is its cores, its GPUs, one device's fp32 GEMM rate, the link two ranks use
on its route (alpha, busbw), the memory of one device, and what starting things costs: a kernel
with the notebook's imports (`kernel_s`), one set of ranks (`startup_s`: spawn, torch import,
process group, CUDA context), one call on running ranks (`call_s`), one figure (`figure_s`).

A notebook's plan (`NotebookPlan`) is its budget, the rank sets it starts, its figures, and its
measurements (`Measurement`): the predicted wall time of one complete round at each size (every
barrier, line-up and reference pass included), warm-up rounds, and a fraction of the budget.
The budget is a clock started before the first set of ranks (labutils.course.plans.Budget): rank
start-up is paid from it, and each measurement in turn gets its fraction of what is left. Within
its share a measurement repeats as many rounds as fit (`plan_reps`), between a minimum and a
maximum; a size whose minimum does not fit is measured once and dropped. So

    T = kernel_s + figures * figure_s + calls * call_s + fixed_s
        + rank_sets * startup_s + sum over measurements, sizes of (warmup + 1 + reps) * round_s

where the 1 is the round timed to pick the repetitions; the last two terms stay within the
budget but for the rounds that the minimum repetitions force beyond it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labutils.core.inputs import check_int, check_range
from labutils.model.sizing import Rates, fit_sizes, plan_reps, share_budget


@dataclass(frozen=True)
class Machine:
    """One machine, as the run-time model sees it (see the module docstring for each field)."""

    name: str
    cores: int
    gpus: int
    flops_per_s: float  # one device: one GPU, or on a machine without GPU one core
    alpha_us: float  # the link two ranks use on this machine's route
    busbw_GBps: float
    memory_bytes: float  # one device's memory (a GPU's, or the host's)
    startup_s: float  # one set of ranks started
    kernel_s: float = 4.0  # a kernel started and the notebook's imports done
    call_s: float = 0.05  # one task handed to running ranks and its result back
    figure_s: float = 0.4  # one figure drawn and embedded

    def __post_init__(self):
        check_int("cores", self.cores, low=1)
        check_int("gpus", self.gpus, low=0)
        for name in ("startup_s", "kernel_s", "call_s", "figure_s"):
            check_range(name, getattr(self, name), low=0, unit="s")

    @property
    def route(self) -> str:
        """"cpu", "one-gpu" (two ranks share it through gloo) or "multi-gpu" (NCCL), as notebooks 09
        and 10 take them with 2 ranks."""
        return "cpu" if self.gpus == 0 else "one-gpu" if self.gpus == 1 else "multi-gpu"

    def rates(self, nproc: int = 2) -> Rates:
        """What one of `nproc` ranks gets: the device's rate divided among the ranks sharing it (on
        the CPU one core per rank; on one GPU all ranks share it), and its share of the memory."""
        sharing = 1 if self.route in ("cpu", "multi-gpu") else nproc
        memory = self.memory_bytes / (nproc if self.route == "cpu" else sharing)
        return Rates(self.flops_per_s / sharing, self.alpha_us, self.busbw_GBps, memory)


@dataclass(frozen=True)
class Measurement:
    """One measuring call: `rounds_s`, the predicted seconds of one complete round per size;
    `fraction` of the notebook's budget; `warmup` untimed rounds; `min_reps`..`max_reps`."""

    what: str
    rounds_s: tuple[float, ...]
    fraction: float
    warmup: int = 2
    min_reps: int = 3
    max_reps: int = 400
    drops: bool = True  # whether the experiment leaves out sizes whose least repetitions do not fit


@dataclass(frozen=True)
class NotebookPlan:
    """A notebook on one machine: its measuring budget, the rank sets it starts, its calls on running
    ranks, its figures, its measurements, and `fixed_s` of other work (reading files, small runs)."""

    name: str
    budget_s: float
    rank_sets: int
    calls: int
    figures: int
    measurements: tuple[Measurement, ...] = ()
    fixed_s: float = 0.0


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds of a notebook, in total and by part, and the sizes the budget drops."""

    name: str
    machine: str
    total_s: float
    parts_s: dict = field(default_factory=dict)
    dropped: tuple[str, ...] = ()


def measurement_s(m: Measurement, share_s: float) -> tuple[float, int]:
    """(seconds, sizes dropped) of one measurement given `share_s`, as the experiments spend it:
    every size warmed up and its round timed once, paid from the share; the largest sizes dropped
    until `min_reps` rounds and one untimed round of the rest fit what is left (`fit_sizes`); the
    rest split over the kept ones (`share_budget`), each its `plan_reps` repetitions."""
    rounds = list(m.rounds_s)
    seconds = sum((m.warmup + 1) * r for r in rounds)
    left_s = max(0.0, share_s - seconds)
    kept, dropped = fit_sizes(rounds, left_s, m.min_reps + 1) if m.drops else (list(range(len(rounds))), [])
    left_s = max(0.0, left_s - sum(rounds[k] for k in kept))
    shares = share_budget([rounds[k] for k in kept], left_s, m.min_reps, m.max_reps)
    for k, share in zip(kept, shares):
        seconds += (1 + plan_reps(rounds[k], share, m.min_reps, m.max_reps).reps) * rounds[k]
    return seconds, len(dropped)


def predict(machine: Machine, plan: NotebookPlan) -> Prediction:
    """The notebook's seconds on `machine` (the formula of the module docstring)."""
    parts = {"kernel": machine.kernel_s, "rank start-up": plan.rank_sets * machine.startup_s,
             "calls": plan.calls * machine.call_s, "figures": plan.figures * machine.figure_s,
             "other": plan.fixed_s}
    dropped = []
    left_s = plan.budget_s - parts["rank start-up"]
    for i, m in enumerate(plan.measurements):
        rest = sum(x.fraction for x in plan.measurements[i:])
        seconds, lost = measurement_s(m, max(0.0, left_s) * m.fraction / rest if rest > 0 else 0.0)
        left_s -= seconds
        parts[m.what] = parts.get(m.what, 0.0) + seconds
        dropped += [m.what] * lost
    return Prediction(plan.name, machine.name, sum(parts.values()), parts, tuple(dropped))


# The machines the lab is held against. Rates are datasheet fp32 (no TF32) GEMM rates at ~75 % of
# peak; links are nccl-tests busbw figures of that class of machine for 2 ranks; start-up costs from
# the lab's runs (about 6.5 s per rank set on an H200, spawn + torch + CUDA + gloo).
MACHINES = {
    "laptop": Machine("2-core CPU laptop", cores=2, gpus=0, flops_per_s=5e10, alpha_us=350.0, busbw_GBps=1.8,
                      memory_bytes=8e9, startup_s=3.0, kernel_s=3.0, figure_s=0.4),
    "h200": Machine("16 cores + 1x H200", cores=16, gpus=1, flops_per_s=5.0e13, alpha_us=150.0, busbw_GBps=2.0,
                    memory_bytes=141e9, startup_s=6.5, kernel_s=3.5),
    "a100x8": Machine("96 cores + 8x A100 (NVLink 3)", cores=96, gpus=8, flops_per_s=1.46e13, alpha_us=15.0,
                      busbw_GBps=230.0, memory_bytes=80e9, startup_s=6.5, kernel_s=3.5),
    "rtx5090x2": Machine("2x RTX 5090 across sockets (22 GB/s)", cores=32, gpus=2, flops_per_s=7.9e13,
                         alpha_us=25.0, busbw_GBps=22.0, memory_bytes=32e9, startup_s=6.5, kernel_s=3.5),
    "h100x8": Machine("8x H100 (NVLink 4)", cores=128, gpus=8, flops_per_s=5.0e13, alpha_us=10.0, busbw_GBps=360.0,
                      memory_bytes=80e9, startup_s=6.5, kernel_s=3.5),
}
