"""Hardening: local ranks bounded by the cores (faked machines); the Python API refuses a student's
bad values naming them; result files respect the umask."""

import math
import os
import warnings

import numpy as np
import pytest

from labutils.core import units
from labutils.core.inputs import LabInputError
from labutils.measure.placement import check_local_ranks, max_local_ranks
from labutils.model import budget, fit


@pytest.mark.parametrize("cores, limit, oversubscribed", [(2, 8, 32), (16, 32, 256), (96, 192, 1536)])
def test_local_ranks_are_bounded_by_the_cores(cores, limit, oversubscribed, tmp_path):
    from labutils.readers.cpus import cpu_layout
    from tests.test_placement import write_sys_tree

    assert max_local_ranks(cores) == limit and max_local_ranks(cores, oversubscribe=True) == oversubscribed
    layout = cpu_layout(str(write_sys_tree(tmp_path, cores_per_socket=cores // 2)), allowed=set(range(cores)))
    assert check_local_ranks(limit, layout, oversubscribe=False) == limit
    with pytest.raises(LabInputError, match=f"nproc={limit + 1} is outside the allowed range \\[1, {limit}\\]"):
        check_local_ranks(limit + 1, layout, oversubscribe=False)
    assert check_local_ranks(limit + 1, layout, oversubscribe=True) == limit + 1
    with pytest.raises(LabInputError, match="nproc"):
        check_local_ranks(oversubscribed + 1, layout, oversubscribe=True)


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


def test_result_files_respect_the_umask(tmp_path):
    from labutils.core.results import write_atomic

    old = os.umask(0o022)
    try:
        assert os.stat(write_atomic(tmp_path / "summary.json", "{}")).st_mode & 0o777 == 0o644
        os.umask(0o077)
        assert os.stat(write_atomic(tmp_path / "index.html", "")).st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
