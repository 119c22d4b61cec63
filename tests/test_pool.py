"""The rank pool: ranks started once and reused, a solo task on rank 0, a failure or a hang named by rank
with every process stopped and the next run restarting, one shared pool per configuration, and nothing
left behind when the launching process exits."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rank_workers import faulty_ping_worker, solo_worker

from labutils.core.inputs import LabInputError
from labutils.measure import pool as lab_pool
from labutils.measure.launch import RankError, ping_worker
from labutils.measure.pool import RANK_LOG_ENV, RankPool, rank_progress, shared_pool, stop_shared_pool


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"  # a zombie is dead for our purpose
    except FileNotFoundError:
        return False


@pytest.mark.distributed
def test_one_start_serves_many_runs_and_a_failure_restarts_it(tmp_path, monkeypatch):
    log = tmp_path / "ranks.log"
    monkeypatch.setenv(RANK_LOG_ENV, str(log))
    # collectives give up at half the starting call's time left: the hung rank's peer reports before the deadline
    pool = RankPool(2, threads_per_rank=1, group_timeout_share=0.5)
    with pytest.raises(LabInputError, match="ranks=3"):
        pool.run(ping_worker, ranks=3)
    assert pool.processes_started == 0  # nothing starts before the first valid run
    first = pool.run(ping_worker, timeout_s=120)
    second = pool.run(ping_worker, timeout_s=60)
    pids = [r["pid"] for r in first]
    assert [r["pid"] for r in second] == pids == pool.pids and pool.processes_started == 2
    assert [r["sum"] for r in second] == [1.0, 1.0]

    solo = pool.run(solo_worker, timeout_s=60, ranks=1)  # rank 1 idles; no collective reaches it
    assert solo == [{"rank": 0, "world_size": 1, "group_size": 1, "pid": pids[0], "iters": 5, "reps": 10, "mean": 3.0}]
    both = pool.run(solo_worker, timeout_s=60)  # and the group is whole again
    assert [(r["world_size"], r["group_size"], r["mean"]) for r in both] == [(2, 2, 3.5)] * 2

    with pytest.raises(RankError) as info:
        pool.run(faulty_ping_worker, kwargs={"fault_rank": 1, "fault": "raise"}, timeout_s=60)
    assert info.value.rank == 1 and "injected failure" in str(info.value)
    assert not pool.running and not any(_alive(p) for p in pids)

    started = time.monotonic()
    with pytest.raises(RankError) as info:  # a fresh set, in which rank 1 hangs
        pool.run(faulty_ping_worker, kwargs={"fault_rank": 1, "fault": "hang"}, timeout_s=20)
    assert time.monotonic() - started < 35
    assert info.value.rank == 1 and "stopped responding" in str(info.value)
    assert pool.processes_started == 4 and pool.pids == []
    lines = log.read_text().splitlines()
    assert len(lines) == 4 and all(" of 2 gloo/cpu parent " in line for line in lines)
    assert not any(_alive(int(line.split()[0])) for line in lines)


@pytest.mark.distributed
def test_the_shared_pool_is_kept_for_its_configuration_and_stopped_for_another():
    stop_shared_pool()  # an earlier test in this process may have left one of the same configuration
    pool = shared_pool(2, "gloo", "cpu", threads_per_rank=1)
    try:
        assert shared_pool(2, "gloo", "cpu", threads_per_rank=1) is pool
        solo = pool.run(solo_worker, timeout_s=120, ranks=1)  # starts both ranks; rank 1 waits for work
        pids = [r["pid"] for r in pool.run(ping_worker, timeout_s=60)]
        assert solo[0]["world_size"] == 1 and solo[0]["pid"] == pids[0] and pool.processes_started == 2
        other = shared_pool(1, "gloo", "cpu")
        assert other is not pool and not pool.running and not any(_alive(p) for p in pids)
        assert shared_pool(1, "gloo", "cpu") is other and other.processes_started == 0
    finally:
        stop_shared_pool()


@pytest.mark.distributed
def test_a_process_that_exits_leaves_no_rank_behind():
    code = textwrap.dedent("""
        from labutils.measure.launch import ping_worker
        from labutils.measure.pool import shared_pool
        print(*(r["pid"] for r in shared_pool(2, threads_per_rank=1).run(ping_worker, timeout_s=120)))
    """)
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


# --- progress bars for the ranks' reports ------------------------------------------------------------

class FakeBar:
    def __init__(self, total, **kwargs):
        self.total, self.n, self.closed, self.kwargs = total, 0, False, kwargs

    def update(self, k):
        self.n += k

    def close(self):
        self.closed = True


def test_bar_follows_rank_zero_and_closes(monkeypatch):
    bars = []
    monkeypatch.setattr(lab_pool, "tqdm", lambda **kw: bars.append(FakeBar(**kw)) or bars[-1])
    with rank_progress(4, "sizes", unit="size") as on_report:
        on_report(0, {"done": 2})
        on_report(1, {"done": 4})  # another rank: ignored
        on_report(0, {"stage": "warm-up"})  # no count: ignored
        assert (bars[0].n, bars[0].total) == (2, 4)
        on_report(0, {"done": 3, "of": 6})
    assert (bars[0].n, bars[0].total, bars[0].closed) == (3, 6, True)
    assert bars[0].kwargs["unit"] == "size"


def test_disabled_bar_gives_no_callback_and_errors_still_close(monkeypatch):
    bars = []
    monkeypatch.setattr(lab_pool, "tqdm", lambda **kw: bars.append(FakeBar(**kw)) or bars[-1])
    with rank_progress(4, "sizes", enabled=False) as on_report:
        assert on_report is None
    assert bars == []
    try:
        with rank_progress(4, "sizes"):
            raise RuntimeError("rank 1 failed")
    except RuntimeError:
        pass
    assert bars[0].closed


def test_a_result_sent_before_a_slower_rank_started_is_kept():
    """Rank 0's first task needs no peer: its result can come before rank 1 says it started."""
    import queue
    import time

    class Alive:
        exitcode = None

        def is_alive(self):
            return True

    pool = RankPool(2, "gloo", "cpu")
    pool._out_q, pool._procs = queue.Queue(), [Alive(), Alive()]
    for message in [("started", 0, 100), ("result", 0, "r0"), ("started", 1, 101), ("result", 1, "r1")]:
        pool._out_q.put(message)
    deadline = time.monotonic() + 5
    assert pool._wait("started", 2, deadline, 5.0, None) == {0: 100, 1: 101}
    assert pool._wait("result", 2, deadline, 5.0, None) == {0: "r0", 1: "r1"}
