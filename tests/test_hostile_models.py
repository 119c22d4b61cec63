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


# --- the third round: the entry points the notebooks call, and the helpers behind them ------------

from labutils.model import ddp_hand as dh  # noqa: E402
from labutils.model import hardware_ratio as hr  # noqa: E402
from labutils.model import sizing as sz  # noqa: E402
from labutils.readers import pcie  # noqa: E402
from labutils.readers import topology as tp  # noqa: E402

RATES = sz.Rates(flops_per_s=1e10, alpha_us=20.0, busbw_GBps=5.0, memory_bytes=2**32)
# Called by a notebook (or the CLI) with the reader's or the user's values: checked where they enter.
ENTRY = [
    (dm.bucket_size_range, dict(widths=[64], depth=2, bucket_caps_mb=[1.0])),  # 10
    (dh.memory_table, dict(param_count=100, world_size=4)),  # 11
    (dh.way_allreduce_bytes, dict(way="bucketed", width=64, depth=2, bucket_mb=1.0)),  # 11
    (sz.compute_size, dict(flops_per_s=1e10, target_ms=2.0)),  # 06
    (sz.layer_plan, dict(rates=RATES, quick=True, nproc=2)),  # 09
    (sz.ddp_plan, dict(rates=RATES, quick=True, budget_s=10.0, depth=4, nproc=2)),  # 10
    (ring.bytes_table, dict(world_sizes=(2, 4), size_bytes=1e6)),  # 04
    (ring.ring_vs_tree_table, dict(world_sizes=(2, 4), size_bytes=1e6)),  # 04
    (ring.digit_inputs, dict(world_size=4)),  # 04
    (hr.hardware_ratio, dict(compute_TFLOPs=312.0, bandwidth_GBps=24.0)),  # 08
    (hr.critical_intensity, dict(compute_TFLOPs=312.0, bandwidth_GBps=24.0, eta=0.8, N=2, Q=1)),  # 08
    (hr.critical_hidden, dict(compute_TFLOPs=312.0, bandwidth_GBps=24.0, eta=0.8, N=2, Q=1)),  # 08
    (hr.layer_ms, dict(flops=1e9, bytes_read=1e6, compute_TFLOPs=312.0, memory_GBps=1000.0)),  # 08
    (hr.mlp_flops, dict(batch_tokens=8, hidden=64, ffn_ratio=4.0)),  # 08
    (hr.mlp_weight_bytes, dict(hidden=64, ffn_ratio=4.0)),  # 08
    (hr.mlp_ms, dict(batch_tokens=8, hidden=64, compute_TFLOPs=312.0, memory_GBps=1000.0)),  # 08
    (hr.turning_tokens, dict(compute_TFLOPs=312.0, memory_GBps=1000.0)),  # 08
    (ts.relu_of_sum_vs_sum_of_relu, dict(a=2, b=-3)),  # 06
    (tp.host_link, dict(facts=None, gpu=0)),  # 01
    (busbw.format_size, dict(nbytes=1e6)),  # 10
]
ROUND = {f.__name__ for f, _ in DDP + ENTRY}

# Public, but called only with values an entry point (named in the comment) already checked.
INTERNAL = {
    "mlp_param_count": "experiments.data_parallel / ddp_step: widths from sizing.ddp_plan",
    "mlp_gradient_bytes": "ddp_plan, ddp_step_s and the experiments: widths from ddp_plan",
    "mlp_for_gradient_bytes": "checks target_bytes itself; called by the experiments with a checked depth",
    "ddp_bucket_sizes": "way_allreduce_bytes and experiments.ddp_by_hand: sizes of a checked model",
    "first_bucket_mb": "way_allreduce_bytes and experiments.ddp_step: a checked bucket cap",
    "mlp_bucket_sizes": "bucket_size_range and experiments.data_parallel: widths of ddp_plan",
    "mlp_bucket_count": "experiments.data_parallel: widths and caps of ddp_plan",
    "distinct_bucket_caps": "experiments.data_parallel: widths and caps of ddp_plan",
    "predict_step": "experiments.data_parallel: measured times and ddp_plan's model",
    "bucket_comm_ms": "experiments.data_parallel: bucket sizes of a planned model, a fitted curve",
    "is_between": "experiments.data_parallel: measured and predicted step times",
    "position": "experiments.data_parallel / ddp_by_hand: measured and predicted step times",
    "estimate_compute": "experiments.data_parallel: measured one-rank times",
    "between_estimates_figure": "experiments.data_parallel: its own results table",
    "way_comm_ms": "experiments.ddp_by_hand: way_allreduce_bytes' sizes",
    "step_estimates_ms": "experiments.ddp_by_hand: measured times",
    "shard_elements": "memory_bytes (memory_table checks param_count and world_size); checks its counts itself",
    "memory_bytes": "memory_table, sizing and run_time: counts memory_table or a plan checked",
    "block_flops": "layer_round_s and layer_plan: sizes of layer_plan (Rates checked)",
    "block_volume_bytes": "layer_round_s and layer_plan: sizes of layer_plan",
    "allreduce_s": "layer_plan, ddp_plan: volumes of their own sizes, checked Rates",
    "break_even_hidden": "layer_plan: a batch of layer_batch, checked Rates",
    "layer_batch": "layer_plan: checked Rates and nproc",
    "layer_memory_bytes": "layer_plan: its own sizes",
    "round_up": "compute_size, layer_plan, ddp_plan: their own finite sizes",
    "layer_round_s": "course.plans: sizes of layer_plan and its modes",
    "ddp_step_flops": "ddp_step_s: widths of ddp_plan",
    "ddp_batch": "ddp_plan: checked Rates and nproc",
    "step_flops_per_s": "ddp_step_s: ddp_batch's batch, checked Rates",
    "ddp_step_s": "ddp_plan and course.plans: widths of ddp_plan",
    "ddp_runs_s": "ddp_plan: its own widths",
    "plan_reps": "run_time and the experiments: round times of a plan, shares of share_budget",
    "share_budget": "run_time and experiments.split_timing: predicted round times, a checked budget_s",
    "fit_sizes": "run_time and experiments.split_timing: predicted round times, a checked budget_s",
    "dropped_sentence": "experiments.split_timing: fit_sizes' dropped indices",
    "regime_sentence": "notebook 08: the two times of layer_ms and turning_tokens (checked there)",
    "regimes_verdict": "notebook 08: two budgets of budget.evaluate (checked there); checks they are scalar",
    "chunk_view": "show.ring_draw: a simulated RingRun",
    "chunk_bounds": "simulate_ring and chunk_view: a RingRun's own length and world size",
    "small_inputs": "bytes_table: world sizes checked there, default seed",
    "ring_schedule": "experiments.hand_ring and simulate_ring: a checked world size",
    "simulate_ring": "notebook 04: digit_inputs' array; checks its shape itself",
    "check_ring_run": "notebook 04: simulate_ring's RingRun",
    "btree_parents": "bytes_sent_per_rank and ring_vs_tree_table: checked world sizes",
    "double_tree_parents": "bytes_sent_per_rank and ring_vs_tree_table: checked world sizes",
    "bytes_sent_per_rank": "ring_vs_tree_table: checked world sizes and size_bytes",
    "steps_each_way": "ring_vs_tree_table: checked world sizes",
    "allreduce_model_us": "ring_vs_tree_table: checks alpha_step_us and link_GBps itself",
    "times_words": "bytes_sentence and fastest_sentence: ratios of ring_vs_tree_table's rows",
    "decimal_size": "fastest_sentence: ring_vs_tree_table's size",
    "bytes_sentence": "notebook 04: ring_vs_tree_table's table; checks algorithm",
    "fastest_sentence": "notebook 04: ring_vs_tree_table's table",
    "toy_input": "course.exercises_tensor_parallel: the fixed toy row",
    "relu": "the experiments and toy_split: tensors they made",
    "split_columns": "the experiments: a checked hidden size and world size",
    "spec_GBps": "pcie_band: a generation and width read from lspci or NVML",
    "pcie_band": "readers, doctor and measure.copies: a generation and width a reader parsed",
    "gen_of_speed": "parse_lspci: a speed read from lspci's LnkCap line",
    "normalize_address": "doctor: addresses parse_lspci read",
    "parse_lspci": "read_lspci_file and doctor.live: text of a checked file or of lspci",
    "read_lspci_file": "doctor --lspci: the CLI checks the file (tests/test_contract.py)",
    "nvidia_gpus": "doctor: parse_lspci's devices",
    "bridges_above": "doctor.rules: parse_lspci's devices",
    "scale_to_pcie": "readers.links and topology: a parsed link",
    "parse_size": "notebook 01 and measure.slurm: the CLI's --size (tests/test_contract.py)",
    "binary_size": "the experiments: sizes of a planned model",
    "GBps": "measure.copies, course.budget_cli: measured bytes and seconds",
    "canonical_dtype": "measure.sweep and experiments.hand_ring: the CLI's --dtype (checked there)",
    "element_bytes": "the models and experiments: a canonical dtype",
    "layout": "measure.sweep, readers.nccl_tests, placement: a checked size, dtype and world size",
    "sweep_sizes": "notebook 02 and measure.sweep: the CLI's checked --min/--max sizes",
    "format_nccl_table": "readers.nccl_tests and measure.sweep: rows they made",
    "print_rows": "readers.nccl_tests and measure.sweep: rows they made",
}
WALKED = [dm, dh, sz, hr, ring, ts, pcie, busbw]


def test_every_public_function_is_in_the_hostile_round_or_listed_internal():
    import inspect
    for module in WALKED:
        for name, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_"):
                assert (name in ROUND) != (name in INTERNAL), f"{module.__name__}.{name}: place it in ENTRY or INTERNAL"


ENTRY_VALUES = [*SPECIAL, 10**400, 1e30, np.array([1.0, 2.0]), [1, 2, 3], "5.0"]


OPEN: set[str] = set()  # entry points still failing a case (strict xfail); none today


@pytest.mark.parametrize("fn, base", [pytest.param(f, b, marks=pytest.mark.xfail(strict=True)) if f.__name__ in OPEN
                                      else (f, b) for f, b in ENTRY], ids=[f.__name__ for f, _ in ENTRY])
def test_an_entry_point_answers_or_names_the_value(fn, base, one_second):
    for name in base:
        if name == "rates":
            continue  # a Rates checks itself when made (test_sizing)
        for value in ENTRY_VALUES:
            one_second()
            try:
                got = fn(**{**base, name: value})
            except LabInputError as exc:
                assert len(str(exc).splitlines()) == 1, (name, value, exc)
                continue
            if hasattr(got, "select_dtypes"):
                got = got.select_dtypes("number").to_numpy(dtype=float)
            if isinstance(got, (float, np.ndarray)):
                no_nan(got)


def test_the_entry_points_refuse_what_used_to_crash_or_overflow():
    for call, needle in ((lambda: dm.bucket_size_range(64.5, 2), "widths=64.5"),
                         (lambda: dm.bucket_size_range([], 2), "widths=\\[\\] is empty"),
                         (lambda: dh.memory_table(math.nan, 4), "param_count"),
                         (lambda: dh.way_allreduce_bytes("flat", 64, 1e300), "depth"),
                         (lambda: dh.way_allreduce_bytes("ddp", 64, 2, bucket_mb=[1, 2]), "bucket_mb must be one"),
                         (lambda: sz.compute_size(1e10, math.inf), "target_ms=inf"),
                         (lambda: sz.compute_size([], 2.0), "flops_per_s must be one"),
                         (lambda: ring.bytes_table(4), None),
                         (lambda: ring.bytes_table((2, 10**6)), "world_sizes"),
                         (lambda: ring.ring_vs_tree_table((2, 4), size_bytes=0), "size_bytes=0"),
                         (lambda: hr.hardware_ratio(1e300, 24.0), "compute_TFLOPs=1e\\+300"),
                         (lambda: hr.mlp_flops(8, 1e300), "hidden=1e\\+300"),
                         (lambda: tp.host_link(math.nan), "facts=nan"),
                         (lambda: busbw.format_size(None), "nbytes")):
        if needle is None:
            assert call()["N"].tolist() == [4]  # one world size is a table of one row
            continue
        with pytest.raises(LabInputError, match=needle):
            call()
    assert dm.bucket_size_range(np.array([64.0]), 2.0, [1.0]) == dm.bucket_size_range([64], 2, [1.0])
    assert busbw.format_size(np.float64(1536)) == "1.5K"
