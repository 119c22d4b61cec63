"""One device's compute rate: a short fp32 matrix product timed on a rank's own device, and with
the saved link, the `Rates` that notebooks 06, 09 and 10 size their experiments from.

Notebooks 06, 09 and 10 size their experiments from it (labutils.model.sizing) instead of from a
table per route: the same code then chooses microsecond layers for a CPU core and millisecond
layers for an H200. The product is n x n by n x n, 2 n^3 flops, repeated for about `seconds`
after two untimed calls; TF32 stays off (torch's default for matmul), as in the experiments.
"""

from __future__ import annotations

import time

import torch

from labutils.core.inputs import check_int, check_range
from labutils.measure.launch import cuda_device_count, free_memory_bytes, ranks_per_gpu
from labutils.measure.pool import shared_pool
from labutils.measure.timing import is_cuda, synchronize
from labutils.model.sizing import Rates


def gemm_n(device: str) -> int:
    """The matrix side: 4096 on a GPU (big enough to fill it), 512 on a CPU core (a few ms a call)."""
    return 4096 if is_cuda(device) else 512


def gemm_flops_per_s(device: str = "cpu", n: int | None = None, seconds: float = 0.2) -> float:
    """fp32 GEMM rate on `device` in flop/s: 2 n^3 per call, calls repeated for about `seconds`."""
    n = gemm_n(device) if n is None else check_int("n", n, low=16, high=32768)
    check_range("seconds", seconds, low=0, low_open=True, high=60, unit="s")
    a = torch.rand(n, n, device=device)
    b = torch.rand(n, n, device=device)
    for _ in range(2):
        a @ b
    synchronize(device)
    calls, start = 0, time.perf_counter()
    while True:
        a @ b
        calls += 1
        if calls % 4 == 0 or not is_cuda(device):
            synchronize(device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return 2.0 * n**3 * calls / elapsed


def gemm_rate_worker(ctx, seconds: float = 0.2) -> float:
    """Run on a rank: the rate of its own device (its GPU, or its cores at its thread count)."""
    return gemm_flops_per_s(ctx.device, seconds=seconds)


def measure_flops_per_s(nproc: int = 2, backend: str = "gloo", device: str = "cpu",
                        threads_per_rank: int | None = None, seconds: float = 0.2, timeout_s: float = 120.0) -> float:
    """The GEMM rate of one rank alone (flop/s): rank 0 of the kernel's `nproc`-rank pool
    (`pool.shared_pool`, the pool the experiments then reuse) while the others wait."""
    pool = shared_pool(nproc, backend, device, threads_per_rank)
    return float(pool.run(gemm_rate_worker, kwargs={"seconds": seconds}, timeout_s=timeout_s, ranks=1)[0])


def measure_rates(link, nproc: int = 2, backend: str = "gloo", device: str = "cpu",
                  threads_per_rank: int | None = None) -> Rates:
    """What one of `nproc` ranks gets on this machine: the GEMM rate measured alone, divided among
    the ranks that share its GPU (all of them on a one-GPU machine; on the CPU each rank has its
    own cores); `link`'s alpha and busbw (a LinkFit, the saved link); the free memory of its
    device divided among the ranks that share it (on the CPU all ranks share the host's)."""
    flops = measure_flops_per_s(nproc, backend, device, threads_per_rank)
    gpus = cuda_device_count() if device == "cuda" else 0
    sharing_compute = ranks_per_gpu(nproc, gpus) if gpus else 1
    sharing_memory = sharing_compute if gpus else nproc
    return Rates(flops / sharing_compute, link.alpha_us, link.busbw_GBps,
                 free_memory_bytes(device, nproc) / sharing_memory)
