"""Every grader of the course (check_prediction, exercises_topology, exercises_busbw, exercises_transports,
exercises_ring,
exercises_tensor_parallel, exercises_budget, exercises_validation, exercises_ddp) on the judging of
labutils.course.grading, table-driven: the right answer, rounded right answers (two significant
figures), the wrong answers a student plausibly gives (each rejected with its own hint), and bad
values (answered with one sentence, never an exception)."""

import ast
import math
import re
from pathlib import Path

import numpy as np
import pytest

from labutils.core.results import DATA_DIR
from labutils.course import (
    exercises_budget,
    exercises_busbw,
    exercises_ddp,
    exercises_ring,
    exercises_tensor_parallel,
    exercises_topology,
    exercises_transports,
    exercises_validation,
    grading,
)
from labutils.course.exercises_budget import check_break_even, check_critical_hidden, check_min_bandwidth
from labutils.course.exercises_busbw import check_busbw
from labutils.course.exercises_ddp import check_hidden_gradient, check_min_busbw
from labutils.course.exercises_ring import (
    check_allreduce_prediction,
    check_ratio_prediction,
    check_ring_bytes,
    check_ring_latency_ranks,
    check_ring_steps,
)
from labutils.course.exercises_tensor_parallel import check_step_allreduce_bytes, check_toy_contribution
from labutils.course.exercises_topology import check_pair_choice, check_planted_fault
from labutils.course.exercises_validation import check_t2_prediction, faster_link
from labutils.course.grading import check_prediction, is_close, read_number
from labutils.doctor.evidence import read_facts
from labutils.experiments.validation import BudgetInputs
from labutils.model import hardware_ratio as hr
from labutils.readers import pcie

# --- the cases: (grader, keyword arguments, right answer, rounded answers, [(wrong answer, words of its hint)]) ---

T2 = BudgetInputs(S_ms=0.233, C_ms=8.0, eta=0.8, Q=1, volume_bytes=116_000, latency_ms=0.02, bandwidth_GBps=2.0)
T2_RIGHT = 0.233 + 8.0 / 1.6 + 0.02 + 0.058  # 5.311 ms, the case: V/B is 1 % of T2
# notebook 09's exercise on a CPU run: V/B (0.03 ms at the doubled B) is small beside T2 (2.44 ms)
MEASURED = BudgetInputs(S_ms=0.1985, C_ms=3.521, eta=1.0, Q=1, volume_bytes=114_688, latency_ms=0.4508,
                        bandwidth_GBps=1.943)
FAST = faster_link(MEASURED)
FAST_RIGHT = 0.1985 + 3.521 / 2 + 0.4508 + 114_688 / 3.886e6  # 2.439 ms
HIDDEN = 989e12 / 25e9  # R/B of an H100 over 200 Gb/s = 25 GB/s, FLOP per byte
H_STAR = hr.critical_hidden(989.0, 25.0, 0.8, 2, 1, "bf16")

CASES = {
    "busbw_all_reduce_N4": (check_busbw, dict(op="all_reduce", size_bytes=1e9, time_us=1e6, world_size=4),
                            1.5, ["1.5", 1.52], [(1.0, "algbw"), (1 / 1.5, "divided by the factor"),
                                                 (12.0, "Gb/s"), (1.5 * 0.9313, "GiB/s"), (0.0015, "microseconds"),
                                                 (1.5 * 0.95367, "MiB")]),
    "busbw_row_N2": (check_busbw, dict(op="all_reduce", size_bytes=2**26, time_us=25_000, world_size=2),
                     2**26 / 25e3 / 1e3, [2.7, "2.7"], [(2**26 / 25e3 / 1e3 * 8, "Gb/s"),
                                                        (2**26 / 25e3 / 1e3 * 0.93132, "GiB/s"),
                                                        (2**26 / 25e3 / 1e6, "microseconds"),
                                                        (2**26 / 25e3, "MB/s")]),
    "busbw_all_gather_N4": (check_busbw, dict(op="all_gather", size_bytes=1e9, time_us=1e6, world_size=4),
                            0.75, [0.75, "0.75"], [(1.0, "algbw"), (1.5, "all_reduce's factor"),
                                                   (1 / 0.75, "divided by the factor"), (6.0, "Gb/s")]),
    "allreduce_prediction": (check_allreduce_prediction, dict(size_bytes=1e9, world_size=4, busbw_GBps=22.0),
                             1.5e9 / 22e6, [68, "68", 68.2], [(1e9 / 22e6, "ring factor"), (0.75e9 / 22e6, "one phase"),
                                                             (2e9 / 22e6, "limit 2"), (1.5e12 / 22e6, "microseconds"),
                                                             (1.5e6 / 22e6, "seconds"), (12e9 / 22e6, "gigabits"),
                                                             (1.5e9 / 22e6 * 1.0737, "GiB")]),
    "ring_latency_ranks": (check_ring_latency_ranks, dict(alpha_step_us=5.0, limit_us=100.0), 12, [12.0, "12"],
                           [(11, "exactly 100"), (16, "power of two"), (8, "not yet above"), (22, "one phase"),
                            (21, "N steps")]),
    "ring_bytes": (check_ring_bytes, dict(size_bytes=1e8, world_size=12), 22 / 12 * 1e8, [1.8e8, "1.83e8"],
                   [(11 / 12 * 1e8, "one phase"), (1e8 / 12, "one chunk"), (2e8, "limit"), (11e8, "naive"),
                    (22 / 12 * 100, "megabytes"), (1e8, "buffer once")]),
    "ring_steps": (check_ring_steps, dict(world_size=12), 22, [22.0, "22"],
                   [(11, "one phase"), (8, "tree"), (12, "one step per rank"), (24, "N steps per phase")]),
    "break_even": (check_break_even, dict(eta=0.8, Q=1, latency_ms=0.03, volume_bytes=8_000_000,
                                            bandwidth_GBps=10.0),
                   0.83 / 0.375, [2.2, "2.2", 2.21], [(0.83, "that is H"), (0.83 * 0.375, "multiplied H"),
                                                     (0.8 / 0.375, "startup"), (0.03 / 0.375, "transfer V/B"),
                                                     (2.45333, "base case"), (0.83 * 1.6, "still computes"),
                                                     (830 / 0.375, "microseconds"), (800.03 / 0.375, "1000 times"),
                                                     (6.43 / 0.375, "gigabits")]),
    "min_bandwidth": (check_min_bandwidth, dict(C_ms=4.0, eta=0.8, Q=4, latency_ms=0.03, volume_bytes=2_000_000),
                      2e6 / 0.345e6, [5.8, "5.8"], [(2e6 / 0.375e6, "startup"), (2e6 / 1.47e6, "share the saving"),
                                                    (2e6 / 0.345e6 * 8, "Gb/s"), (2e6 / 0.345e6 * 0.93132, "GiB/s"),
                                                    (2e6 / 0.345e3, "MB/s"), (2e6 / 0.595e6, "still computes")]),
    "critical_hidden": (check_critical_hidden, dict(compute_TFLOPs=989.0, bandwidth_GBps=25.0, eta=0.8, N=2, Q=1,
                                                      wire_dtype="bf16"),
                        H_STAR, [float(f"{H_STAR:.2g}"), f"{H_STAR:.3g}"],
                        [(H_STAR * 16 / 2, "that is I*"), (HIDDEN * 2 / 16, "R/B alone"),
                         (H_STAR * 2, "wire dtype"), (H_STAR / 8, "Gb/s")]),
    "t2_prediction": (check_t2_prediction, dict(inputs=T2), T2_RIGHT, [5.3, "5.31", 5.311],
                      [(T2_RIGHT - 0.058, "bandwidth term V/B is missing"), (5.25, "bandwidth term V/B is missing"),
                       (0.233 + 4.0 + 0.078, "2 eta"), (T2_RIGHT - 0.02, "latency is missing"),
                       (T2_RIGHT - 0.233, "S is missing"), (T2_RIGHT + 0.058 * 999, "1000 times"),
                       (T2_RIGHT + 0.058 * 7, "gigabits"), (5.2, "communication is missing"), (8.233, "that is T1")]),
    "t2_faster_link": (check_t2_prediction, dict(inputs=FAST), FAST_RIGHT, [2.4, "2.44", 2.439],
                       [(FAST_RIGHT + 114_688 / 3.886e6, "link as measured"), (2.5, "link as measured"),
                        (FAST_RIGHT - 0.4508, "latency is missing"), (FAST_RIGHT - 0.1985, "S is missing"),
                        (FAST_RIGHT + 7 * 114_688 / 3.886e6, "gigabits"), (3.7195, "that is T1")]),
    "hidden_gradient": (check_hidden_gradient, dict(backward_ms=40.0, busbw_GBps=1.0, world_size=8, compute_ms=60.0),
                        40e6 / 1.75, [2.3e7, "22857143"], [(40e6, "whole buffer"), (40e6 / 1.75**2, "multiplied by"),
                                                           (60e6 / 1.75, "backward time"), (22.857, "megabytes"),
                                                           (40e6 / 1.75 / 2**20, "MiB"), (5e6 / 1.75, "gigabits")]),
    "min_busbw": (check_min_busbw, dict(gradient_bytes=64e6, compute_ms=60.0, world_size=4, efficiency=0.9),
                  1.5 * 64e6 / (60 / 9 * 1e6), [14, "14.4"], [(1.5 * 64 / 6, "c (1/0.9 - 1)"), (9.6, "ring factor"),
                                                              (14.4 * 8, "Gb/s"), (14.4 * 0.93132, "GiB/s"),
                                                              (3.0, "too slow"), (40.0, "smallest")]),
    "step_allreduce_bytes": (check_step_allreduce_bytes, dict(layers=32, batch=4, sequence=2048, hidden=4096),
                             4 * 32 * 8192 * 4096 * 2, [8.6e9, "8.59e9"],
                             [(2 * 32 * 8192 * 4096 * 2, "forward pass"), (4 * 8192 * 4096 * 2, "one layer"),
                              (4 * 32 * 4 * 4096 * 2, "batch alone"), (4 * 32 * 8192 * 4096 * 4, "fp32"),
                              (4 * 32 * 8192 * 4096 * 16, "bits"), (4 * 32 * 8192 * 4096 * 2 / 1e6, "megabytes")]),
    "inference_allreduce_bytes": (check_step_allreduce_bytes, dict(layers=32, batch=1, sequence=2048, hidden=4096,
                                                                   training=False),
                                  2 * 32 * 2048 * 4096 * 2, [1.1e9, "1.07e9"],
                                  [(4 * 32 * 2048 * 4096 * 2, "training step"), (32 * 2048 * 4096 * 2, "own g"),
                                   (2 * 2048 * 4096 * 2, "one layer"), (2 * 32 * 2048 * 4096 * 16, "bits")]),
}


def stable_id(value) -> str:
    """A test id that is the same in every process (an object()'s repr holds its address)."""
    return "object()" if type(value) is object else repr(value)


@pytest.mark.parametrize("name", CASES)
def test_the_right_answer_is_right(name):
    grader, kwargs, right, _, _ = CASES[name]
    reply = grader(right, **kwargs)
    assert reply.startswith("Right"), reply


@pytest.mark.parametrize("name", CASES)
def test_rounded_right_answers_are_right_and_told_the_precise_value(name):
    grader, kwargs, right, rounded, _ = CASES[name]
    for answer in rounded:
        reply = grader(answer, **kwargs)
        assert reply.startswith("Right"), (answer, reply)
        if isinstance(right, float) and float(answer) != right:
            assert f"{right:.4g}" in reply, reply


@pytest.mark.parametrize("name", CASES)
def test_each_plausible_slip_gets_its_own_hint(name):
    grader, kwargs, _, _, wrong = CASES[name]
    assert len(wrong) >= 4 and len({w for w, _ in wrong}) == len(wrong)
    for answer, words in wrong:
        reply = grader(answer, **kwargs)
        assert reply.startswith("Not yet") and words in reply, (answer, reply)


BAD = [None, "abc", "", math.nan, math.inf, -math.inf, -1, True, [1, 2], {"a": 1}, object()]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("bad", BAD, ids=stable_id)
def test_bad_values_get_one_sentence_and_never_raise(name, bad):
    grader, kwargs, _, _, _ = CASES[name]
    reply = grader(bad, **kwargs)
    assert isinstance(reply, str) and not reply.startswith("Right"), reply
    assert reply.count(". ") <= 2 and len(reply) < 400, reply


@pytest.mark.parametrize("name", CASES)
def test_a_string_holding_a_number_is_read_as_that_number(name):
    grader, kwargs, right, _, wrong = CASES[name]
    for answer in (right, wrong[0][0]):
        assert grader(repr(float(answer)), **kwargs) == grader(float(answer), **kwargs)


def test_the_old_fixed_one_percent_let_a_dropped_term_pass():
    """The issue's case: V/B is 1 % of T2, so within 1 % the slip passed; now it is named."""
    slip = T2_RIGHT - 0.058
    assert abs(slip - T2_RIGHT) / T2_RIGHT < 0.012
    assert "V/B is missing" in check_t2_prediction(slip * 1.002, T2)
    assert check_t2_prediction(T2_RIGHT * 0.9995, T2).startswith("Right")
    rounded = check_t2_prediction(5.3, T2)  # two figures cannot tell 5.311 from 5.291 (no latency)
    assert rounded.startswith("Right") and "latency is missing" in rounded


def test_the_faster_link_exercise_refuses_the_measured_link_whenever_two_figures_tell_them_apart():
    """Forgetting to double B gives T2 on the measured link: refused with its slip named whenever it
    differs from the right T2 at two significant figures; the exercise enlarges V until it does."""
    assert FAST.volume_scale == 1 and FAST.inputs.bandwidth_GBps == pytest.approx(2 * 1.943)
    assert FAST.measured_bandwidth_GBps == 1.943 and "measured: 1.943 GB/s" in FAST.describe()
    for v_bytes in (1e3, 1e4, 114_688, 1e5, 1e6, 1e7):  # V/B from negligible to dominant
        inputs = BudgetInputs(S_ms=0.1985, C_ms=3.521, eta=0.9, Q=1, volume_bytes=v_bytes, latency_ms=0.4508,
                              bandwidth_GBps=1.943)
        ex = faster_link(inputs)
        f = ex.inputs
        right = f.S_ms + f.C_ms / (2 * f.eta) + f.latency_ms + f.volume_bytes / (f.bandwidth_GBps * 1e6)
        slow = right + f.volume_bytes / (f.bandwidth_GBps * 1e6)
        assert f"{right:.2g}" != f"{slow:.2g}", (v_bytes, ex)
        assert f.volume_bytes == v_bytes * ex.volume_scale and f.bandwidth_GBps == pytest.approx(2 * 1.943)
        assert (ex.volume_scale > 1) == (f"{check_t2_slow(inputs)[0]:.2g}" == f"{check_t2_slow(inputs)[1]:.2g}")
        if ex.volume_scale > 1:
            assert f"{ex.volume_scale}x the layer's" in ex.describe()
        for answer in (slow, float(f"{slow:.2g}"), float(f"{slow:.3g}")):
            reply = check_t2_prediction(answer, ex)
            assert reply.startswith("Not yet") and "link as measured" in reply, (v_bytes, answer, reply)
        assert check_t2_prediction(float(f"{right:.2g}"), ex).startswith("Right")
    # without the measured bandwidth the grader cannot name that slip, and says nothing of it
    assert "link as measured" not in check_t2_prediction(2.5, FAST.inputs)


def check_t2_slow(inputs):
    """(T2 with B doubled, T2 with B as measured) for the layer's own V."""
    base = inputs.S_ms + inputs.C_ms / (2 * inputs.eta) + inputs.latency_ms
    wire = inputs.volume_bytes / (inputs.bandwidth_GBps * 1e6)
    return base + wire / 2, base + wire


# --- the reader and the closeness rule ----------------------------------------------------------

@pytest.mark.parametrize("value, answer, ok", [(1.820, 1.8, True), (2.2133, 2.2, True), (2.2133, 2.0, False),
                                               (0.0612, 0.061, True), (0.0612, 0.06, False), (5.311, 5.3, True),
                                               (9.96, 9.9, True), (9.96, 9.0, False), (1e8, 1.0e8, True)])
def test_two_significant_figures_count(value, answer, ok):
    assert is_close(answer, value) is ok


@pytest.mark.parametrize("answer, words", [(None, "Replace None"), ("abc", "not 'abc'"), (math.nan, "NaN"),
                                           (math.inf, "finite"), (-1, "positive"), (True, "yes/no"),
                                           ([1], "one number")])
def test_read_number_says_what_to_give(answer, words):
    value, hint = read_number(answer, "GB/s")
    assert value is None and words in hint and "GB/s" in hint


def test_read_number_reads_strings_and_allows_never_when_asked():
    assert read_number(" 26 ", "GB/s") == (26.0, "")
    assert read_number(math.inf, "ms", allow_inf=True) == (math.inf, "")


def test_never_is_right_only_when_nothing_pays():
    assert check_break_even(math.inf, eta=0.5).startswith("Right")
    assert "never" in check_break_even(5.0, eta=0.5)
    assert check_critical_hidden(math.inf, eta=0.5).startswith("Right")
    assert "finite answer exists" in check_break_even(math.inf)


# --- notebook 01: the pair and its busbw -------------------------------------------------------

@pytest.mark.parametrize("sample, pair, busbw, words", [
    ("two_gpu_sys", (0, 1), 22, "is right"), ("two_gpu_sys", ("GPU0", "GPU1"), "22", "is right"),
    ("two_gpu_sys", (0, 1), 22.4, "is right"), ("two_gpu_sys", (0, 1), 21, "Not yet"),
    ("two_gpu_sys", (0, 1), 24.2, "more than was measured"), ("two_gpu_sys", (0, 1), 19.8, "pessimistic"),
    ("two_gpu_sys", (0, 1), 20.5, "GiB/s"), ("two_gpu_sys", (0, 1), 23.6, "1.0737"),
    ("two_gpu_sys", (0, 1), 11, "halves"), ("two_gpu_sys", (0, 1), 44, "both directions"),
    ("two_gpu_sys", (0, 1), 50, "clean PCIe 5.0"), ("two_gpu_sys", (0, 1), 176, "Gb/s"),
    ("two_gpu_sys", (0, 1), "26", "more than was measured"), ("two_gpu_sys", (0, 1), 5, "pessimistic"),
    ("eight_gpu_pcie_switches", (0, 1), 26, "is right"), ("eight_gpu_pcie_switches", (5, 4), 31.5, "is right"),
    ("eight_gpu_pcie_switches", (0, 1), 13, "PCIe 3.0"), ("eight_gpu_pcie_switches", (0, 1), 55, "PCIe 5.0"),
    ("eight_gpu_pcie_switches", (0, 1), 200, "Gb/s"),
    ("eight_gpu_pcie_switches", (0, 1), 100, "cannot beat the wire"),
    ("eight_gpu_pcie_switches", (0, 1), 2, "pessimistic")])
def test_pair_choice_busbw(sample, pair, busbw, words):
    reply = check_pair_choice(sample, pair, busbw)
    assert reply.startswith("Good pair") and words in reply, reply


@pytest.mark.parametrize("pair", [(np.int64(0), np.int64(1)), (0.0, 1.0), ("0", "1.0"), ("GPU0", "gpu1"),
                                  np.array([0, 1])])
def test_pair_choice_reads_gpu_indices_as_typed(pair):
    assert check_pair_choice("eight_gpu_pcie_switches", pair).startswith("Good pair")


def test_planted_fault_reads_gpu_indices_as_typed():
    sick, band = _planted()
    for gpu in (np.int64(sick.index), float(sick.index), f"{sick.index}.0", f" GPU{sick.index} "):
        assert check_planted_fault(gpu).startswith("Right GPU"), gpu
    for bad in ("5.5", 5.5, True, "five", (5,)):
        assert not check_planted_fault(bad).startswith("Right GPU"), bad


def test_pair_choice_pair():
    wrong = check_pair_choice("eight_gpu_pcie_switches", (0, 4))
    assert wrong.startswith("Not yet") and "SYS" in wrong and "GPU0-GPU1" not in wrong
    assert "estimate" in check_pair_choice("eight_gpu_pcie_switches", (5, 4))
    for bad in [(0, 0), (0, 5), None, "01", 3, (math.nan, 1)]:
        assert check_pair_choice("two_gpu_sys", bad).startswith("Not yet")
    assert "no sample topology" in check_pair_choice("nowhere", (0, 1))


@pytest.mark.parametrize("bad", BAD, ids=stable_id)
def test_pair_choice_bad_busbw_gets_a_sentence(bad):
    reply = check_pair_choice("two_gpu_sys", (0, 1), bad)
    if bad is None:
        assert "estimate" in reply
    else:
        assert "But the busbw" in reply and "GB/s" in reply, reply


# --- notebook 01: the planted fault ------------------------------------------------------------

def _planted():
    facts = read_facts(DATA_DIR / "doctor" / "facts_exercise.json")
    (sick,) = [g for g in facts.gpus if g.pcie_gen < g.pcie_gen_max]
    return sick, pcie.pcie_band(sick.pcie_gen, sick.pcie_width)


def test_planted_fault_right():
    sick, band = _planted()
    assert "is right" in check_planted_fault(sick.index, band.high_GBps)
    assert "is right" in check_planted_fault(f"GPU{sick.index}", str(band.high_GBps))
    assert "is right" in check_planted_fault(sick.index, float(f"{band.high_GBps:.2g}"))
    assert "Now the ceiling" in check_planted_fault(sick.index)


def test_planted_fault_slips():
    sick, band = _planted()
    other = (sick.index + 1) % 8
    assert check_planted_fault(other).startswith("Not yet") and f"GPU{other}" in check_planted_fault(other)
    for ceiling, words in [(pcie.pcie_band(sick.pcie_gen_max).high_GBps, "gen 4"),
                           (band.low_GBps, "low (typical) end"), (band.high_GBps * 8, "Gb/s"),
                           (band.high_GBps * 0.93132, "GiB/s"), (3.3, "scale it by the width")]:
        reply = check_planted_fault(sick.index, ceiling)
        assert reply.startswith("Right GPU") and "not yet right" in reply and words in reply, reply
    assert "no GPU9" in check_planted_fault(9)


@pytest.mark.parametrize("gpu", [None, "fast", math.nan, 2.5, True, "planted"], ids=stable_id)
def test_planted_fault_nonsense_gpu(gpu):
    text = check_planted_fault(gpu, 15.75)
    assert text.startswith("Give the GPU's index as a whole number") and text.endswith(".")


@pytest.mark.parametrize("ceiling", [math.nan, "fast", [1], -1, math.inf], ids=stable_id)
def test_planted_fault_nonsense_ceiling(ceiling):
    sick, _ = _planted()
    reply = check_planted_fault(sick.index, ceiling)
    assert "The ceiling:" in reply and "GB/s" in reply, reply


# --- notebook 05: the toy contribution ---------------------------------------------------------

@pytest.mark.parametrize("answer, words", [([4, 12], "Right"), ((4.0, 12.0), "Right"), ([9, 2], "ReLU"),
                                           ([-1, 2], "device 1"), ([3, 14], "whole output"),
                                           ([3, 14], "counted from 1"), ([6, 24], "wrong split"),
                                           ([0, 0], "Step by step")])
def test_toy_contribution(answer, words):
    assert words in check_toy_contribution(answer)


@pytest.mark.parametrize("bad", [None, "abc", "4, 12", [1, 2, 3], [math.nan, 1], 5, {"a": 1}, True], ids=stable_id)
def test_toy_contribution_bad_values(bad):
    reply = check_toy_contribution(bad)
    assert isinstance(reply, str) and not reply.startswith(("Right", "Not yet")), reply


# --- predictions made before measuring ----------------------------------------------------------

@pytest.mark.parametrize("predicted, words", [(None, "before you run"), ("fast", "not 'fast'"), (math.nan, "NaN"),
                                              (-1, "positive"), (math.inf, "finite"), (2.2, "Close"), ("2.2", "Close"),
                                              (20.0, "too high"), (0.2, "too low"), (16.0, "Gb/s")])
def test_prediction_says_how_far_off(predicted, words):
    assert words in check_prediction(predicted, 2.0, "GB/s", "the peak busbw"), words


def test_prediction_without_a_measurement_and_the_ring_ratio():
    assert "no valid measurement" in check_prediction(1.0, math.nan, "x", "the speedup")
    assert "no valid measurement" in check_ratio_prediction(1.0, None)
    assert "Close" in check_ratio_prediction(1.6, 1.5)
    assert "too high" in check_ratio_prediction(16.0, 1.5) and "Python call" in check_ratio_prediction(16, 1.5)
    assert "1000" in check_prediction(2000.0, 2.0, "ms", "the step time")


# --- one home --------------------------------------------------------------------------------------

# Every grader of the course, by the module of the part it grades.
GRADERS = {
    grading: ("check_prediction",),
    exercises_topology: ("check_pair_choice", "check_planted_fault"),
    exercises_busbw: ("check_busbw",),
    exercises_transports: ("check_path",),
    exercises_ring: ("check_ratio_prediction", "check_ring_bytes", "check_ring_steps", "check_allreduce_prediction",
                     "check_ring_latency_ranks"),
    exercises_tensor_parallel: ("check_toy_contribution", "check_step_allreduce_bytes"),
    exercises_budget: ("check_break_even", "check_min_bandwidth", "check_critical_hidden"),
    exercises_validation: ("check_t2_prediction",),
    exercises_ddp: ("check_hidden_gradient", "check_min_busbw"),
}
GRADER_FILES = {Path(m.__file__).name for m in GRADERS}


def test_every_grader_lives_with_its_part_of_the_course():
    """No module of labutils but the grader modules (GRADERS) defines a grader: by name, or by shape
    (check_* whose first parameter is a student's answer, guess or prediction)."""
    names = {n for found in GRADERS.values() for n in found}
    shape = re.compile(r"answer|guess|predict")
    for path in Path(grading.__file__).parent.parent.rglob("*.py"):
        if path.name in GRADER_FILES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            assert node.name not in names, f"{path.name} defines the grader {node.name}"
            first = node.args.args[0].arg if node.args.args else ""
            assert not (node.name.startswith("check_") and shape.search(first)), f"{path.name}: {node.name}"
    for module, found in GRADERS.items():
        for name in found:
            assert callable(getattr(module, name)), f"{module.__name__}.{name}"


def test_graders_answer_cases_they_cannot_grade():
    from labutils.course.exercises_ring import check_allreduce_prediction
    from labutils.course.exercises_topology import check_pair_choice

    assert "cannot be graded" in check_allreduce_prediction(1.0, 1e6, 2, 0)
    assert "barely changes" not in check_allreduce_prediction(0.0, 1e6, 1, 10.0)
    assert "sound" not in check_pair_choice("two_gpu_sys", (0, 1), math.nan)


# --- notebook 03: which way a connection of an NCCL log went ------------------------------------------

NCCL_SAMPLES = DATA_DIR / "nccl_debug"


@pytest.mark.parametrize("log, src, dst, right, wrong", [
    ("net_ib_2nodes_4gpu_srun.log", 1, 2, "network", "direct"),  # between the two nodes
    ("net_ib_2nodes_4gpu_srun.log", 0, 1, "direct", "network"),  # inside node-a
    ("p2p_ipc_4gpu_pcie_nccl28.log", 3, 0, "direct", "host memory"),  # older NCCL: bus ids, no index
    ("shm_2gpu_sys.log", 0, 1, "host memory", "direct"),
])
def test_check_path_right_and_wrong(log, src, dst, right, wrong):
    path = NCCL_SAMPLES / log
    reply = exercises_transports.check_path(right, path, src, dst)
    assert reply.startswith("Right") and f"{src} -> {dst}" in reply, reply
    assert exercises_transports.check_path(f"  {right.upper()} ", path, src, dst).startswith("Right")
    reply = exercises_transports.check_path(wrong, path, src, dst)
    assert reply.startswith("Not yet") and "via" in reply and right not in reply.split("says it")[0], reply


def test_check_path_reads_a_transport_name_as_its_way():
    path = NCCL_SAMPLES / "shm_2gpu_sys.log"
    assert exercises_transports.check_path("SHM/direct/direct", path, 0, 1).startswith("Right")
    assert exercises_transports.check_path("P2P/IPC", path, 0, 1).startswith("Not yet")


@pytest.mark.parametrize("bad", [None, "", 3, ["direct"], "sideways"])
def test_check_path_bad_answers_get_one_sentence(bad):
    reply = exercises_transports.check_path(bad, NCCL_SAMPLES / "shm_2gpu_sys.log", 0, 1)
    assert "direct" in reply and "host memory" in reply and not reply.startswith("Right"), reply


def test_check_path_cannot_grade_a_missing_log_or_connection(tmp_path):
    assert "cannot be graded" in exercises_transports.check_path("direct", tmp_path / "none.log", 0, 1)
    assert "no connection 5 -> 6" in exercises_transports.check_path("direct", NCCL_SAMPLES / "shm_2gpu_sys.log", 5, 6)


def test_the_ring_exercises_ask_for_an_n_that_no_cell_above_prints():
    """04's tables print the steps and bytes at the N they list: the exercises ask for another N."""
    import json

    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "04_ring_by_hand.ipynb"
    code = ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    asked = {int(n) for n in re.findall(r"check_ring_(?:steps|bytes)\(.*world_size=(\d+)", "\n".join(code))}
    printed = {4}  # the drawing's ring
    for listing in re.findall(r"(?:bytes_table\(\(|ns = np\.array\(\[)([\d, ]+)", "\n".join(code)):
        printed |= {int(x) for x in listing.split(",") if x.strip()}
    assert asked == {12} and {2, 3, 8, 16, 64, 128} <= printed
    assert not asked & printed
