"""Which case this machine is in (CPU only, one GPU, several GPUs) and what the lab measures there."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from labutils.launch import cuda_device_count


@dataclass(frozen=True)
class MachineCase:
    """`kind` is "cpu", "one-gpu" or "multi-gpu"; `gpu_names` in device order."""

    kind: str
    gpu_count: int
    gpu_names: tuple[str, ...]
    cpu_count: int

    @property
    def label(self) -> str:
        if self.kind == "cpu":
            return "CPU only (no CUDA GPU visible)"
        return f"{self.gpu_count} GPU(s): {', '.join(self.gpu_names)}"


def detect_case(gpu_count: int | None = None) -> MachineCase:
    """Read the GPU count (torch.cuda) and names; `gpu_count` overrides it (for teaching and tests)."""
    import os

    names: tuple[str, ...] = ()
    count = cuda_device_count() if gpu_count is None else gpu_count
    if count and gpu_count is None:
        import torch

        names = tuple(torch.cuda.get_device_name(i) for i in range(count))
    elif count:
        names = tuple(f"GPU{i}" for i in range(count))
    kind = "cpu" if count == 0 else "one-gpu" if count == 1 else "multi-gpu"
    return MachineCase(kind, count, names, os.cpu_count() or 1)


def announce(plan: dict[str, str], case: MachineCase | None = None) -> MachineCase:
    """Print which case this notebook runs in and what it will measure there.

    `plan` maps "cpu", "one-gpu", "multi-gpu" to one sentence each.
    """
    case = case or detect_case()
    print(f"This machine: {case.label}; {case.cpu_count} CPU core(s); Python {platform.python_version()}.")
    print(f"In this case the notebook measures: {plan.get(case.kind, plan.get('cpu', ''))}")
    return case
