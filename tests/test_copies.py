"""The copy probes: host copies measure a positive bandwidth; GPU copies and the peer-access matrix
(skipped without CUDA)."""

import math

import pandas as pd
import pytest
import torch

from labutils.measure.copies import (
    Band,
    copy_table,
    expected_bands,
    h2d_d2h,
    measure_copies,
    peer_access_matrix,
    wire_fraction,
)
from labutils.readers.topology import GpuFacts, load_sample

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


def _copies(rows):
    return pd.DataFrame(rows, columns=["kind", "src", "dst", "size_bytes", "ms", "GBps", "pinned"])


def test_h2d_band_comes_from_the_live_link_not_pcie_4(h200):
    """The bug: a PCIe 5.0 x16 H200 measured 55.4 GB/s H2D and was shown against 24-31.5."""
    frame = _copies([("H2D", "cpu", "cuda:0", 1 << 28, 4.8, 55.4, True),
                     ("D2H", "cuda:0", "cpu", 1 << 28, 4.9, 55.1, True)])
    bands = expected_bands(frame, facts=[h200])
    assert [(b.low_GBps, b.high_GBps) for b in bands] == [(50, 63), (50, 63)]
    assert "PCIe 5.0 x16" in bands[0].route and "gen 1" in bands[0].note
    assert wire_fraction(55.4, bands[0]) == pytest.approx(55.4 / 63)
    table = copy_table(frame, bands)
    assert table["of_wire"].round(3).tolist() == [round(55.4 / 63, 3), round(55.1 / 63, 3)]
    assert table["expected"].tolist() == ["50-63", "50-63"]
    x8 = expected_bands(frame, facts=[GpuFacts(0, "x", 4, 4, 8, 8, 0)])[0]
    assert (x8.low_GBps, x8.high_GBps) == (12, 15.75)
    assert tuple(expected_bands(frame)[0]) == (24, 31.5)  # no NVML: the default generation, and it says so
    assert math.isnan(wire_fraction(1.0, None))


def test_gpu_pair_band_says_when_it_goes_through_host_memory():
    topo = load_sample("two_gpu_phb")
    frame = _copies([("D2D", "cuda:0", "cuda:1", 1 << 28, 20.0, 13.0, True), ("host", "cpu", "cpu", 1, 1, 5.0, False)])
    facts = [GpuFacts(i, "x", 4, 4, 16, 16, 0) for i in (0, 1)]
    no_peer = pd.DataFrame([[True, False], [False, True]], index=["GPU0", "GPU1"], columns=["GPU0", "GPU1"])
    band, host = expected_bands(frame, topo, facts, no_peer)
    assert "through host memory" in band.route and "host memory" in band.note and host is None
    assert (band.low_GBps, band.high_GBps) == (12, 25)
    peer = expected_bands(frame, topo, facts, ~no_peer | no_peer.T)[0]  # peer access on
    assert "peer-to-peer" in peer.route and (peer.low_GBps, peer.high_GBps) == (24, 31.5)
    assert "NCCL's default" in expected_bands(frame, topo, facts)[0].note
    assert copy_table(frame, [band, host])["route"].tolist()[1] == "CPU memory, no link"
    assert tuple(Band(1, 2, "r", "ref")) == (1, 2)
