"""Hardening: the parsers never raise anything but LabInputError on arbitrary text and never report
a wrong world size; the Python API refuses a student's bad values naming them."""

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labutils.core import units
from labutils.core.busbw import bus_factor
from labutils.core.inputs import LabInputError
from labutils.model import budget, fit
from labutils.readers.nccl_tests import parse_text
from labutils.readers.topology import parse_topology

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEAD = ("#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong")


def nccl_log(n: int, ranks=None, header: bool = True, sizes=(1 << 20, 1 << 24, 1 << 26)) -> str:
    """An all_reduce_perf log of `n` ranks; `ranks` limits the # Rank lines kept (a cut log)."""
    lines = ["# all_reduce_perf"]
    if header:
        lines.append(f"# nThread 1 nGpus {n} minBytes 8 maxBytes 67108864 step: 2(factor) warmup iters: 5 iters: 20")
    for r in (range(n) if ranks is None else ranks):
        lines.append(f"#  Rank {r:2d} Group  0 Pid  4182 on host device {r:2d} [0x{r:02x}] NVIDIA H100")
    lines.append(HEAD)
    for size in sizes:
        t = 5.0 + size / 2e4
        alg = size / t / 1e3
        bus = alg * bus_factor("all_reduce", n)
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum      -1  {t:7.2f}  {alg:6.2f}  {bus:6.2f}      0"
                     f"  {t:7.2f}  {alg:6.2f}  {bus:6.2f}      0")
    lines.append("# Avg bus bandwidth    : 12.3456 ")
    return "\n".join(lines) + "\n"


def test_a_log_cut_to_its_tail_keeps_its_world_size():
    cut = nccl_log(8, ranks=[0, 1])  # the case: two # Rank lines survive, the header says 8
    log = parse_text(cut)
    assert log.meta["world_size"] == 8 and "nGpus 8" in log.meta["world_size_source"]
    assert log.meta["bus_factor"] == pytest.approx(1.75)
    headless = parse_text(nccl_log(8, ranks=[6, 7], header=False))
    assert headless.meta["world_size"] == 8 and headless.meta["world_size_source"].startswith("busbw/algbw")
    assert parse_text(nccl_log(8, ranks=[], header=False), nranks=8).meta["world_size"] == 8


def test_rank_lines_from_0_are_not_the_world_when_the_numbers_say_more():
    """A headless log cut to rank 0's line: busbw/algbw says many ranks, so the answer is unknown,
    never 1 (hypothesis found n = 30); a complete headless log keeps its count."""
    cut = parse_text(nccl_log(30, ranks=[0], header=False))
    assert cut.meta["world_size"] is None and "--nranks" in cut.meta["world_size_source"]
    assert parse_text(nccl_log(2, ranks=[0, 1], header=False)).meta["world_size"] == 2


def test_sources_that_disagree_are_refused_and_nranks_must_agree():
    with pytest.raises(LabInputError, match="disagrees"):
        parse_text(nccl_log(8).replace("nGpus 8", "nGpus 2"))
    with pytest.raises(LabInputError, match="--nranks says 4"):
        parse_text(nccl_log(8), nranks=4)
    with pytest.raises(LabInputError, match="Rank line for rank 7"):
        parse_text(nccl_log(4, ranks=[0, 7]))


def test_the_log_own_avg_line_is_quoted_and_old_layouts_get_no_root(capsys):
    from labutils.cli import main

    assert main(["parse-nccl-tests", "data/nccl_tests/sample_all_reduce_old_layout.log"]) == 0
    out = capsys.readouterr().out
    assert "# Avg bus bandwidth    : 5.3301" in out and "root" not in out
    assert main(["parse-nccl-tests", "data/nccl_tests/sample_all_reduce_2x5090_sys.log"]) == 0
    assert "Avg bus bandwidth    : 8.34782" in capsys.readouterr().out


@FAST
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400))
def test_nccl_tests_reader_raises_only_lab_input_error(text):
    try:
        log = parse_text(text)
    except LabInputError:
        return
    world = log.meta["world_size"]
    assert world is None or (isinstance(world, int) and world >= 1)
    assert log.frame["world_size"].nunique(dropna=False) == 1


ROW_PIECES = st.sampled_from(["#", "# nThread 1 nGpus 4", "#  Rank  3 Group 0 Pid 1 on h device 3 [0x1] G",
                              HEAD, "   1024   256   float   sum   -1   5.0   0.20   0.30   0   5.0   0.20   0.30   0",
                              "   2048   512   float   sum   -1", "   7.0   0.29   0.44   0", "nan", "N/A", "-1",
                              "1e999", "h:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 4 cudaDev 0", "{", "0: ", "\t"])


@FAST
@given(st.lists(ROW_PIECES, max_size=12), st.lists(st.text(max_size=20), max_size=3))
def test_nccl_tests_reader_on_log_shaped_junk(pieces, noise):
    try:
        log = parse_text("\n".join(pieces + noise))
    except LabInputError:
        return
    assert log.meta["world_size"] in (None, 4) or log.meta["world_size"] >= 1


@FAST
@given(st.integers(min_value=2, max_value=72), st.data())
def test_world_size_is_right_however_the_log_is_cut(n, data):
    kept = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n).map(sorted))
    header = data.draw(st.booleans())
    log = parse_text(nccl_log(n, ranks=kept, header=header))
    assert log.meta["world_size"] in (n, None)
    if header:
        assert log.meta["world_size"] == n


@FAST
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400))
def test_topology_reader_raises_only_lab_input_error(text):
    try:
        topo = parse_topology(text)
    except LabInputError:
        return
    assert all(len(row) == len(topo.devices) for row in topo.matrix)


CELLS = st.sampled_from(["X", "NV1", "NV12", "NV0", "NV99999999999999999999", "PIX", "PXB", "PHB", "NODE", "SYS",
                         "SOC", "QPI", "N/A", "0-23", "\x1b[4m"])


@FAST
@given(st.integers(1, 5), st.lists(st.lists(CELLS, max_size=7), max_size=6))
def test_topology_reader_on_matrix_shaped_junk(n, rows):
    text = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\n"
    text += "\n".join(f"GPU{i}\t" + "\t".join(r) for i, r in enumerate(rows)) + "\n"
    try:
        topo = parse_topology(text)
    except LabInputError:
        return
    assert len(topo.gpus) == n and all(topo.matrix[i][i] == "X" for i in range(n))


BAD = [None, "3", "fast", math.nan, math.inf, -1.0, True, [1, 2, 3]]


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_budget_api_names_a_bad_value(value):
    params = dict(budget.BASE_CASE)
    name = "Q" if value != math.inf else "C_ms"
    params[name] = value
    if isinstance(value, list):
        params["eta"] = np.array([0.7, 0.8])  # (3,) against (2,): they do not broadcast
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(LabInputError, match=name if not isinstance(value, list) else "broadcast"):
            budget.evaluate(**params)


def test_budget_never_reason_and_huge_C_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = budget.evaluate(**{**budget.BASE_CASE, "bandwidth_GBps": 1e-320})
        assert "eta <=" not in budget.verdict(b) and "bandwidth is too low" in budget.verdict(b)
        low = budget.evaluate(**{**budget.BASE_CASE, "eta": 0.4})
        assert "eta <= 0.5" in budget.verdict(low)
        huge = budget.evaluate(**{**budget.BASE_CASE, "C_ms": 1e308})
        assert huge.min_eta == pytest.approx(0.5)
    arrays = budget.evaluate(**{**budget.BASE_CASE, "C_ms": np.array([1.0, 12.0])})
    with pytest.raises(LabInputError, match="arrays of shape"):
        budget.verdict(arrays)


@pytest.mark.parametrize("call, name", [
    (lambda: fit.allreduce_ms(1e6, 2, -1.0), "busbw_GBps"),
    (lambda: fit.allreduce_ms(1e6, 2, 10.0, alpha_us=-5), "alpha_us"),
    (lambda: fit.allreduce_ms(1e6, 2, 10.0, buckets=0), "buckets"),
    (lambda: fit.allreduce_ms(1e6, 2, 10.0, buckets=1.5), "buckets"),
    (lambda: fit.allreduce_ms(None, 2, 10.0), "size_bytes"),
    (lambda: fit.allreduce_ms(np.ones(3), np.array([2, 4]), 10.0), "broadcast"),
    (lambda: fit.latency_term_us(4, math.nan), "alpha_step_us"),
    (lambda: units.GBps(1e6, 0), "seconds"),
    (lambda: units.GBps(-1, 1), "nbytes"),
    (lambda: units.parse_size("64Mb"), "bits"),
    (lambda: units.parse_size("1 kb"), "bits"),
    (lambda: units.parse_size(None), "size"),
    (lambda: units.parse_size(2**70), "size"),
])
def test_fit_and_units_refuse_naming_the_value(call, name):
    with pytest.raises(LabInputError, match=name):
        call()


def test_exact_sizes_and_graders():
    from labutils.course.exercises import check_allreduce_prediction, check_pair_choice

    assert units.parse_size("1234567890123456") == 1234567890123456
    assert units.parse_size("1.5K") == 1536
    assert fit.allreduce_ms(0, 2, 0.0) == 0.0  # nothing to send: 0 ms, not NaN
    assert "cannot be graded" in check_allreduce_prediction(1.0, 1e6, 2, 0)
    assert "barely changes" not in check_allreduce_prediction(0.0, 1e6, 1, 10.0)
    assert "sound" not in check_pair_choice("two_gpu_sys", (0, 1), math.nan)
