"""Grader of notebook 11 (data parallelism by hand): the student's bucket hook, run on real ranks.

`check_bucket_hook(hook, ...)` sends the hook's source to the ranks (a function defined in a
notebook cannot be pickled to a spawned process), runs one step of the reference buckets and of
the student's (`ddp_by_hand.bucketed` with the hook) from DDP's weights and batch, and judges:

1. it finished: a hook that leaves a rank waiting in a collective another rank never makes
   (a deadlock) ends at `timeout_s` with every rank stopped (the pool's deadline), and the reply
   names the timeout; a hook that raises is quoted;
2. every rank made the same collective calls;
3. the gradients equal torch DDP's (largest relative difference < `ddp_by_hand.GRAD_TOLERANCE`),
   with a hint from the number of all-reduces it made against one per bucket;
4. then, only for a right hook, its step time against the flat all-reduce (b) and the reference (d).
"""

from __future__ import annotations

import inspect
import textwrap

from labutils.experiments.ddp_by_hand import GRAD_TOLERANCE, Model, check_ways, time_ways
from labutils.measure.launch import RankError

_TIMED_OUT = ("stopped responding", "did not finish", "timed out", "timeout")


def hook_source(hook) -> tuple[str, str]:
    """(source, name) of a hook function, for `ddp_by_hand.load_hook` in the ranks."""
    return textwrap.dedent(inspect.getsource(hook)), hook.__name__


def check_bucket_hook(hook, model: Model, nproc: int = 2, backend: str = "auto", device: str = "auto",
                      budget_s: float = 3.0, timeout_s: float = 30.0) -> str:
    """Notebook 11: the student's bucket hook on `nproc` real ranks (module docstring). Never raises
    for the student's mistakes; one reply starting "Right" or "Not yet"."""
    if not callable(hook):
        return f"Give your hook function itself (my_bucket_hook), not {hook!r}."
    try:
        source = hook_source(hook)
    except (OSError, TypeError):
        return "Define your hook with `def` in a cell of its own, so that its source can be sent to the ranks."
    try:
        check = check_ways(model, nproc, backend, device, ways=("bucketed", "student"), timeout_s=timeout_s,
                           hook_source=source)
    except RankError as exc:
        if any(word in str(exc).lower() for word in _TIMED_OUT):
            return (f"Not yet: timed out after {timeout_s:g} s ({exc}). A rank was left waiting in a collective that "
                    "another rank never made: every rank must launch the same all-reduces in the same order, one "
                    "per bucket (no condition on the rank). Every rank was stopped; the next run starts new ones.")
        return f"Not yet: your hook failed in a rank ({exc})."
    mine, ref = check.loc["student"], check.loc["bucketed"]
    if not mine["same_calls"]:
        return ("Not yet: the ranks made different collective calls with your hook; every rank must make the same "
                "all-reduces, of the same sizes, in the same order.")
    made, want = int(mine["all_reduces"]), int(ref["all_reduces"])
    if not mine["matches_ddp"]:
        hint = ("it launched no all-reduce: the buckets were never summed over the ranks. Launch the bucket's "
                "all-reduce once its last gradient is in." if made == 0 else
                f"it launched {made} all-reduces per step where there are {want} buckets: launch each bucket's "
                "once, when it is full." if made != want else
                "it launched one all-reduce per bucket, but the buffer it sent did not yet hold every gradient: "
                "copy the gradient in first, launch when the bucket is full.")
        return (f"Not yet: your gradients differ from torch DDP's by {mine['max_rel_diff']:.2g} (relative; "
                f"tolerance {GRAD_TOLERANCE:g}): {hint}")
    times = time_ways(model, budget_s, nproc, backend, device, ways=("flat", "bucketed", "student"),
                      timeout_s=timeout_s + 4 * budget_s)
    return "Right: " + hook_time_sentence(times, made)


def hook_time_sentence(times, all_reduces: int, slower: float = 1.15) -> str:
    """The student's right hook, its step against (b) and (d) from `time_ways` rows, from the numbers;
    much slower than (d) suggests each all-reduce was waited for inside the hook."""
    mine, flat, ref = (float(times.loc[w, "step_ms"]) for w in ("student", "flat", "bucketed"))
    text = (f"your gradients equal torch DDP's and every rank made the same {all_reduces} all-reduce(s). Your step "
            f"took {mine:.3g} ms: {mine / flat:.2f}x the flat all-reduce's ({flat:.3g} ms) and {mine / ref:.2f}x the "
            f"reference buckets' ({ref:.3g} ms).")
    if mine > slower * ref:
        text += (" Slower than the reference: if your hook waits for the all-reduce (async_op=False, or .wait()), "
                 "backward stops at every bucket and nothing overlaps.")
    return text
