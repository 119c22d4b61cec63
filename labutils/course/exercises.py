"""Every student grader of the lab, on one shared way of reading and judging an answer.

A grader takes the student's answer (whatever was typed: a number, a string of a number, None,
NaN, a list...) and returns one reply; it never raises. The reply starts with "Right" when the
answer is right, "Not yet" when it is not, or is one sentence asking for a usable answer.

How an answer is judged (`grade`):

- **read** (`read_number`): None, text that is not a number, NaN, inf (unless "never" is a
  possible answer), True/False, a list, a negative number where none makes sense: one sentence
  saying what to give instead. A string holding a number ("26") is read as that number.
- **close** (`window`, `rounds_to`): the right value rounded to two or three significant figures
  is right (2.2133 ms written "2.2", 1.820 GB/s written "1.8"), and the reply gives the precise
  value (and names a slip that would round the same, if any). Otherwise an answer counts as a
  value when it is within 1 % of it or within half a unit of its second significant figure.
- **slips**: each grader lists the values the likely slips give (the ring factor 2(N-1)/N; a
  dropped term; algbw for busbw; 1024 for 1000...). The answer is matched to the *nearest* of
  the right value and the slips among those it is close to, so the tolerance is set by the
  slips: an answer that left a small term out is nearer the slip than the right value and gets
  that slip's hint, however small the term (`check_t2_prediction`'s V/B, 1 % of T2). The slips
  of the answer's unit (`unit_slips`: GB/s vs Gb/s x8, GiB/s vs GB/s x1.0737, MB vs MiB, ms vs
  us x1000) are candidates too, but never overrule an answer close to the right value.
- otherwise "Not yet", how far off (the factor) and how to compute it.

Predictions made before a measurement are judged by `check_prediction`: how far off, never
right or wrong.

Notebooks import every grader from here; they are written in labutils.course.exercises_links (notebooks
01-04 and the prediction checks) and labutils.course.exercises_budget (notebooks 05-08), on the helpers of
labutils.course.grading.

The numbers come from the model modules (budget, fit, collectives, ring, topology, doctor,
tensor_parallel, data_parallel); no formula is repeated here.
"""

from labutils.course.exercises_budget import (
    check_break_even,
    check_critical_hidden,
    check_hidden_gradient,
    check_min_bandwidth,
    check_min_busbw,
    check_t2_prediction,
    check_toy_contribution,
)
from labutils.course.exercises_links import (
    check_allreduce_prediction,
    check_busbw,
    check_pair_choice,
    check_planted_fault,
    check_prediction,
    check_ratio_prediction,
    check_ring_bytes,
    check_ring_latency_ranks,
    check_ring_steps,
    ring_latency_ranks,
)
from labutils.course.grading import is_close, read_number, read_whole

# Every grader of the lab (a test checks that no other module defines one).
GRADERS = ("check_prediction", "check_ratio_prediction", "check_pair_choice", "check_planted_fault", "check_busbw",
           "check_ring_bytes", "check_ring_steps", "check_allreduce_prediction", "check_ring_latency_ranks",
           "check_toy_contribution", "check_break_even", "check_min_bandwidth", "check_critical_hidden",
           "check_t2_prediction", "check_hidden_gradient", "check_min_busbw")

__all__ = [
    "GRADERS",
    "check_prediction",
    "check_ratio_prediction",
    "check_pair_choice",
    "check_planted_fault",
    "check_busbw",
    "check_ring_bytes",
    "check_ring_steps",
    "check_allreduce_prediction",
    "check_ring_latency_ranks",
    "check_toy_contribution",
    "check_break_even",
    "check_min_bandwidth",
    "check_critical_hidden",
    "check_t2_prediction",
    "check_hidden_gradient",
    "check_min_busbw",
    "ring_latency_ranks",
    "is_close",
    "read_number",
    "read_whole",
]
