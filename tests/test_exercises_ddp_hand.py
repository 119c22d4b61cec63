"""labutils.course.exercises_ddp_hand: the grader runs a student's bucket hook on real gloo ranks and
replies to a right, a wrong and a deadlocking hook (a named timeout, every rank stopped)."""

import pandas as pd

from labutils.course.exercises_ddp_hand import check_bucket_hook, hook_source, hook_time_sentence
from labutils.experiments.ddp_by_hand import Model
from labutils.measure import pool

SMALL = Model(width=64, depth=3, batch_per_rank=8, bucket_mb=0.015)


def right_hook(bucket, param, comm):
    bucket.slot(param).copy_(param.grad)
    bucket.ready += 1
    if bucket.full():
        bucket.work = comm.all_reduce(bucket.buffer, async_op=True)


def stub_hook(bucket, param, comm):  # the notebook's stub: runs, never sends
    bucket.slot(param).copy_(param.grad)
    bucket.ready += 1


def too_early_hook(bucket, param, comm):
    bucket.slot(param).copy_(param.grad)
    bucket.ready += 1
    comm.all_reduce(bucket.buffer)


def rank_zero_hook(bucket, param, comm):  # rank 0 waits for an all-reduce its peer never makes
    bucket.slot(param).copy_(param.grad)
    bucket.ready += 1
    if bucket.full() and dist.get_rank() == 0:  # noqa: F821 - dist is in the ranks' namespace
        bucket.work = comm.all_reduce(bucket.buffer, async_op=True)


def test_a_right_hook_is_right_and_timed_against_flat_and_the_reference():
    reply = check_bucket_hook(right_hook, SMALL, 2, "gloo", "cpu", budget_s=0.5, timeout_s=60)
    assert reply.startswith("Right: your gradients equal torch DDP's") and "same 3 all-reduce(s)" in reply
    assert "the flat all-reduce's" in reply and "reference buckets'" in reply


def test_wrong_hooks_get_the_hint_their_calls_give():
    reply = check_bucket_hook(stub_hook, SMALL, 2, "gloo", "cpu", timeout_s=60)
    assert reply.startswith("Not yet: your gradients differ") and "launched no all-reduce" in reply
    reply = check_bucket_hook(too_early_hook, SMALL, 2, "gloo", "cpu", timeout_s=60)
    assert reply.startswith("Not yet") and "launched 6 all-reduces per step where there are 3 buckets" in reply
    assert check_bucket_hook("my_hook", SMALL).startswith("Give your hook function itself")


def test_a_deadlocking_hook_ends_in_a_named_timeout_with_every_rank_stopped():
    reply = check_bucket_hook(rank_zero_hook, SMALL, 2, "gloo", "cpu", timeout_s=15)
    assert reply.startswith("Not yet: timed out after 15 s") and "rank 0" in reply.replace("rank(s) 0", "rank 0")
    shared = pool.shared_pool(2, "gloo", "cpu")
    assert not shared.running and shared.pids == []  # nothing left running


def test_hook_source_and_the_time_sentence():
    source, name = hook_source(right_hook)
    assert name == "right_hook" and source.startswith("def right_hook(")
    times = pd.DataFrame({"step_ms": [10.0, 8.0, 12.0]}, index=["flat", "bucketed", "student"])
    text = hook_time_sentence(times, 3)
    assert "12 ms: 1.20x the flat all-reduce's (10 ms) and 1.50x the reference buckets' (8 ms)" in text
    assert "nothing overlaps" in text
    assert "nothing overlaps" not in hook_time_sentence(times.assign(step_ms=[10.0, 8.0, 8.5]), 3)
