"""Hardening: local ranks bounded by the cores (faked machines); graders answer what they cannot grade;
result files respect the umask."""

import math
import os

import pytest

from labutils.core.inputs import LabInputError
from labutils.measure.placement import check_local_ranks, max_local_ranks


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


def test_graders_answer_cases_they_cannot_grade():
    from labutils.course.exercises_ring import check_allreduce_prediction
    from labutils.course.exercises_topology import check_pair_choice

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
