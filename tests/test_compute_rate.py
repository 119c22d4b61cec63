"""labutils.measure.compute_rate: the GEMM rate, and the Rates a rank gets with the GPU count faked."""

import pytest

from labutils.core.inputs import LabInputError
from labutils.measure import compute_rate


def test_gemm_rate_is_a_positive_rate_on_the_cpu():
    flops = compute_rate.gemm_flops_per_s("cpu", n=64, seconds=0.02)
    assert 1e6 < flops < 1e14
    with pytest.raises(LabInputError, match="seconds"):
        compute_rate.gemm_flops_per_s("cpu", n=64, seconds=0)


class Link:
    alpha_us, busbw_GBps = 300.0, 2.0


@pytest.mark.parametrize("device, gpus, flops_share, memory_share", [
    ("cpu", 0, 1, 2),     # each rank its own cores; the host's memory shared by both ranks
    ("cuda", 1, 2, 2),    # two ranks time-share one GPU and its memory
    ("cuda", 8, 1, 1),    # a GPU per rank
])
def test_rates_divide_what_ranks_share(monkeypatch, device, gpus, flops_share, memory_share):
    monkeypatch.setattr(compute_rate, "measure_flops_per_s", lambda *a, **k: 6e13)
    monkeypatch.setattr(compute_rate, "cuda_device_count", lambda: gpus)
    monkeypatch.setattr(compute_rate, "free_memory_bytes", lambda dev, n: 80e9)
    rates = compute_rate.measure_rates(Link(), 2, "gloo" if gpus < 2 else "nccl", device)
    assert rates.flops_per_s == 6e13 / flops_share and rates.memory_bytes == 80e9 / memory_share
    assert (rates.alpha_us, rates.busbw_GBps) == (300.0, 2.0)
