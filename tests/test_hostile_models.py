"""The second round of hostile input, for the graders and the models they stand on: every public
`check_*` a notebook calls, and the value-taking functions of the DDP model, the ring, the toy
split and the bus factors, given what tests/test_hostile.py gives the budget and the fit (NaN,
infinities, 0, -0.0, 10**400, booleans, text numbers, numpy scalars and arrays, lists of the wrong
length, dicts, objects).

A grader never raises: any answer, and any case value, gets one reply (a string), and a right
answer in any reasonable type (numpy scalar, whole float, "5.0") is called right. A model function
answers (a number, inf for "never", never NaN) or refuses with one line naming the parameter."""

import math
import signal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labutils.core import busbw
from labutils.core.inputs import LabInputError
from labutils.course import exercises_budget as eb
from labutils.course import exercises_busbw as ebw
from labutils.course import exercises_ddp as ed
from labutils.course import exercises_ring as er
from labutils.course import exercises_tensor_parallel as et
from labutils.course import exercises_topology as eto
from labutils.course import grading
from labutils.model import ddp_model as dm
from labutils.model import ring
from labutils.model import toy_split as ts
from tests.test_hostile import SPECIAL, answer_or_refusal, hostile, no_nan

FEW = settings(max_examples=15, deadline=None)
HOSTILE = st.one_of(hostile, st.sampled_from([10**400, np.array([1.0, 2.0]), [1, 2, 3], "5.0", " 12 ", -0.0]))

# (grader, its case as the notebook gives it, the right answer)
GRADERS = [
    (eb.check_break_even, {}, None),
    (eb.check_min_bandwidth, {}, None),
    (eb.check_critical_hidden, {}, None),
    (ebw.check_busbw, dict(op="all_reduce", size_bytes=1e6, time_us=100.0, world_size=4), 15.0),
    (ed.check_hidden_gradient, dict(backward_ms=10.0, busbw_GBps=5.0, world_size=4, compute_ms=20.0), None),
    (ed.check_min_busbw, dict(gradient_bytes=1e8, compute_ms=20.0, world_size=4, efficiency=0.9), None),
    (er.check_ratio_prediction, dict(measured=2.0), None),
    (er.check_ring_bytes, dict(size_bytes=1e8, world_size=8), 1.75e8),
    (er.check_ring_steps, dict(world_size=8), 14),
    (er.check_allreduce_prediction, dict(size_bytes=1e8, world_size=8, busbw_GBps=10.0), 17.5),
    (er.check_ring_latency_ranks, dict(alpha_step_us=5.0, limit_us=100.0), 12),
    (et.check_toy_contribution, {}, None),
    (et.check_step_allreduce_bytes, dict(layers=2, batch=4, sequence=8, hidden=16), None),
    (eto.check_planted_fault, {}, None),
    (grading.check_prediction, dict(measured=2.0, unit="ms", what="the time"), None),
]
IDS = [g.__name__ for g, _, _ in GRADERS]


class Hang(Exception):
    """A grader ran past its second: a runaway."""


@pytest.fixture
def one_second():
    def stop(*_):
        raise Hang()
    old = signal.signal(signal.SIGALRM, stop)
    yield lambda: signal.alarm(2)
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def reply_of(grader, *args, **kwargs) -> str:
    """The grader's reply, which must be one non-empty string, whatever it was given."""
    reply = grader(*args, **kwargs)
    assert isinstance(reply, str) and reply.strip(), (grader.__name__, args, kwargs, reply)
    assert len(reply) < 1500, reply  # one reply, not a dump
    return reply


@FEW
@given(answer=HOSTILE)
@pytest.mark.parametrize("grader, case, right", GRADERS, ids=IDS)
def test_a_grader_answers_any_answer_in_one_reply(grader, case, right, answer):
    reply_of(grader, answer, **case)


@pytest.mark.parametrize("grader, case, right", GRADERS, ids=IDS)
def test_a_grader_answers_any_case_value_and_never_runs_away(grader, case, right, one_second):
    for name in case:
        if name in ("unit", "what", "op"):
            continue
        for value in [*SPECIAL, 10**400, np.array([1.0, 2.0]), [1, 2, 3], "5.0"]:
            one_second()
            reply_of(grader, 1.0 if right is None else right, **{**case, name: value})


@pytest.mark.parametrize("grader, case, right", [g for g in GRADERS if g[2] is not None],
                         ids=[g.__name__ for g, _, r in GRADERS if r is not None])
def test_a_right_answer_is_right_in_any_reasonable_type(grader, case, right):
    for given_as in (right, float(right), np.float64(right), np.int64(right) if float(right).is_integer() else right,
                     str(float(right)), f" {right} "):
        reply = reply_of(grader, given_as, **case)
        assert reply.startswith("Right") and "nan" not in reply.lower(), (grader.__name__, given_as, reply)


def test_the_replies_to_what_used_to_raise():
    assert "too large" in grading.read_number(10**400, "ms")[1]
    assert "no valid measurement" in grading.check_prediction(1.0, 10**400, "ms", "x")
    assert "cannot be graded" in er.check_ring_bytes(1e8, 1e8, world_size=None)
    assert "cannot be graded (world_size" in er.check_ring_steps(14, world_size=0)
    assert "cannot be graded (alpha_step_us=0.0" in er.check_ring_latency_ranks(12, alpha_step_us=0.0)
    assert "cannot be graded (limit_us" in er.check_ring_latency_ranks(12, limit_us=math.inf)
    assert "cannot be graded (x must be one row" in et.check_toy_contribution([1, 2], x=[1, 2, 3])
    assert "cannot be graded (compute_ms" in ed.check_hidden_gradient(1e6, 10.0, 5.0, 4, compute_ms="5")
    assert eb.check_min_bandwidth(1.0, Q=0).startswith(("Right", "Not yet"))
    assert "cannot be graded (world_size" in ebw.check_busbw(15.0, "all_reduce", 1e6, 100.0, [2, 4])
    assert "GPU" in eto.check_planted_fault(10**400)


def test_the_ring_latency_ranks_are_closed_form_and_fast():
    for alpha, limit in ((5.0, 100.0), (2.5, 100.0), (3.0, 7.0), (1e-3, 1e-2), (5.0, 0.0)):
        for algorithm in ("ring", "tree"):
            n = er.ring_latency_ranks(alpha, limit, algorithm)
            from labutils.model.fit import latency_term_us
            assert latency_term_us(n, alpha, algorithm) > limit >= latency_term_us(n - 1, alpha, algorithm) or n == 2
    assert er.ring_latency_ranks(5.0, 100.0) == 12
    assert er.ring_latency_ranks(2.5, 100.0, "tree") == 2**20 + 1
    with pytest.raises(LabInputError, match="limit_us=1e\\+300 is above"):
        er.ring_latency_ranks(5.0, 1e300)


# --- the models the graders stand on --------------------------------------------------------------

DDP = [
    (dm.predicted_efficiency, dict(gradient_bytes=1e6, busbw_GBps=5.0, compute_ms=10.0, world_size=4)),
    (dm.min_busbw_for_efficiency, dict(gradient_bytes=1e6, compute_ms=10.0, world_size=4, efficiency=0.9,
                                       alpha_us=0.0, buckets=1)),
    (dm.max_hidden_gradient_bytes, dict(backward_ms=10.0, busbw_GBps=5.0, world_size=4, alpha_us=0.0, buckets=1)),
    (ring.ring_bytes_per_rank, dict(size_bytes=1e6, world_size=4)),
    (busbw.bus_factor, dict(op="all_reduce", world_size=4)),
    (busbw.bandwidths_GBps, dict(op="all_reduce", size_bytes=1e6, time_us=100.0, world_size=4)),
    (ts.toy_split, dict(x=ts.TOY_X)), (ts.toy_whole, dict(x=ts.TOY_X)), (ts.toy_wrong_split, dict(x=ts.TOY_X)),
]


@FEW
@given(case=st.sampled_from(DDP), value=HOSTILE, data=st.data())
def test_a_model_answers_or_names_the_parameter(case, value, data):
    fn, base = case
    name = data.draw(st.sampled_from(sorted(base)))
    try:
        got = fn(**{**base, name: value})
    except LabInputError as exc:
        assert len(str(exc).splitlines()) == 1 and (name in str(exc) or "array inputs" in str(exc)), (name, exc)
        return
    if fn is busbw.bandwidths_GBps and not float(np.asarray(value, dtype=float).min()) > 0:
        return  # a row nccl-tests could not time: (NaN, NaN), as documented
    if isinstance(got, ts.ToySplit):
        got = np.concatenate([c.ravel() for c in got.contributions])
    no_nan(got)


def test_the_models_refuse_what_used_to_give_nan_or_crash():
    for call, needle in ((lambda: dm.max_hidden_gradient_bytes(math.nan, 5.0, 4), "backward_ms=nan"),
                         (lambda: dm.max_hidden_gradient_bytes(None, 5.0, 4), "backward_ms must be a number"),
                         (lambda: dm.min_busbw_for_efficiency(None, 10.0, 4), "gradient_bytes"),
                         (lambda: dm.min_busbw_for_efficiency(1e6, math.inf, 4), "compute_ms=inf"),
                         (lambda: dm.min_busbw_for_efficiency(1e6, 10.0, 4, buckets=0.5), "buckets"),
                         (lambda: dm.predicted_efficiency(1e6, 5.0, 10.0, "x"), "world_size"),
                         (lambda: dm.predicted_efficiency(1e6, 5.0, 10.0, 2.5), "world_size=2.5"),
                         (lambda: busbw.bus_factor(np.array(["all_reduce", "broadcast"]), 4), "op="),
                         (lambda: busbw.bus_factor("all_reduce", [2, 2.5]), "world_size=2.5"),
                         (lambda: busbw.bus_factor("all_reduce", 10**400), "world_size"),
                         (lambda: busbw.bandwidths_GBps("all_reduce", None, 100.0, 4), "size_bytes"),
                         (lambda: ts.toy_split(x=[[0.5, 1]]), "x=0.5 is not a whole number"),
                         (lambda: ts.toy_whole(x=[1, 2, 3]), "two whole numbers")):
        with pytest.raises(LabInputError, match=needle):
            call()
    assert dm.max_hidden_gradient_bytes(10.0, 5.0, 1) == math.inf  # one rank: nothing to hide, "never" full
    assert ts.toy_split(x=np.array([1.0, -1.0])).total.tolist() == ts.toy_whole().tolist()


def test_nothing_here_escapes_the_shared_checks():
    assert answer_or_refusal(busbw.bus_factor, "all_reduce", np.float64(4.0)) == 1.5
