"""The copy probes: host copies measure a positive bandwidth; GPU copies and the peer-access matrix
(skipped without CUDA)."""

import pytest
import torch

from labutils.measure.copies import h2d_d2h, measure_copies, peer_access_matrix

NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (copy probes, peer access)")


def test_peer_access_answers_without_a_gpu():
    if not torch.cuda.is_available():
        assert peer_access_matrix() is None


def test_host_copy_measures_a_positive_bandwidth():
    frame = measure_copies(1 << 20, iters=2, progress=False)
    assert (frame.GBps > 0).all() and (frame.size_bytes == 1 << 20).all()
    if not torch.cuda.is_available():
        assert list(frame.kind) == ["host"]


@NEEDS_GPU
def test_gpu_copies_and_peer_matrix():
    results = h2d_d2h(0, 16 << 20, iters=3)
    assert [r.kind for r in results] == ["H2D", "D2H"] and all(r.GBps > 0.1 for r in results)
    peers = peer_access_matrix()
    assert peers.shape == (torch.cuda.device_count(),) * 2 and peers.values.diagonal().all()
