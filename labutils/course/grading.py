"""How every grader of the course reads and judges a student's answer, and the one grader every
notebook uses: `check_prediction`, a prediction made before a measurement judged by how far off it
was, never right or wrong.

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

`read_number` / `read_whole` read what was typed; `window`, `is_close`, `rounds_to` and `nearest`
judge closeness; `unit_slips` lists the slips a unit invites; `grade` puts them together into one
reply. The graders sit with the part of the course they grade: `check_prediction` here (every notebook),
`exercises_topology` (01), `exercises_busbw` (02), `exercises_transports` (03), `exercises_ring` (04-05),
`exercises_tensor_parallel` (06-07), `exercises_budget` (08), `exercises_validation` (09),
`exercises_ddp` (10), `exercises_ddp_hand` (11). Their numbers come from the model modules; no
formula is repeated in a grader.
"""

from __future__ import annotations

import math

import numpy as np

GiB_PER_GB = 1e9 / 2**30  # 1 GB/s = 0.931 GiB/s
MiB_PER_MB = 1e6 / 2**20  # 1 MB = 0.954 MiB

# --- reading an answer ----------------------------------------------------------------------------


def read_number(answer, unit: str, *, allow_inf: bool = False, allow_negative: bool = False,
                allow_zero: bool = True) -> tuple[float | None, str]:
    """(the answer as a float, "") or (None, one sentence asking for a usable answer). Never raises.

    A string holding a number is read as that number ("26" -> 26.0); None, other text, NaN,
    True/False, containers, inf (unless `allow_inf`: "never"), negative numbers (unless
    `allow_negative`) and zero (unless `allow_zero`) get a sentence naming `unit`.
    """
    never = " (math.inf for never)" if allow_inf else ""
    number = a_number(unit)
    if answer is None:
        return None, f"Replace None with your answer, {number}{never}."
    if isinstance(answer, bool):
        return None, f"{answer} is a yes/no, not a number; give {number}{never}."
    if isinstance(answer, (list, tuple, dict, set, np.ndarray)):
        return None, f"Give one number{_in(unit)}{never}, not {type(answer).__name__} {_shown(answer)}."
    try:
        value = float(answer.strip() if isinstance(answer, str) else answer)
    except (TypeError, ValueError):
        return None, f"Give {number}{never}, not {_shown(answer)}."
    except OverflowError:  # an int past float's range (10**400)
        return None, f"{_shown(answer)} is too large to be an answer here; give {number}{never}."
    if math.isnan(value):
        return None, f"NaN is not an answer; give {number}{never}."
    if math.isinf(value) and not (allow_inf and value > 0):
        return None, f"{answer!r} is not an answer here; give a finite number{_in(unit)}."
    if value < 0 and not allow_negative:
        return None, f"{value:g} cannot be right: the answer is a positive number{_in(unit)}{never}."
    if value == 0 and not allow_zero:
        return None, f"0 cannot be right: the answer is a positive number{_in(unit)}{never}."
    return value, ""


def _shown(answer, limit: int = 40) -> str:
    """repr(answer), cut to `limit` characters: a reply stays one readable sentence."""
    text = repr(answer)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _in(unit: str) -> str:
    return f" in {unit}" if unit and unit != "x" and not unit.startswith("whole number") else ""


def a_number(unit: str) -> str:
    """How a reply asks for an answer in `unit`: "a number in GB/s", "a whole number of ranks"."""
    return f"a {unit}" if unit.startswith("whole number") else f"a number{_in(unit)}"


def read_whole(answer, what: str, low: int = 1) -> tuple[int | None, str]:
    """(a whole number >= `low`, "") or (None, one sentence). "12", 12.0 and 12 are all 12."""
    value, hint = read_number(answer, f"whole number of {what}")
    if value is None:
        return None, hint
    if not float(value).is_integer():
        return None, f"{value:g} is not a whole number of {what}; count them."
    if value < low:
        return None, f"{value:g} cannot be right: there are at least {low} {what}."
    return int(value), ""


# --- closeness ------------------------------------------------------------------------------------


def window(value: float, rel_tol: float = 0.01) -> float:
    """How far an answer may be from `value` and still count as it: the larger of `rel_tol`
    (relative) and half a unit of `value`'s second significant figure (1.820 -> 0.05, so "1.8"
    counts; 2.2133 -> 0.05; 0.0612 -> 0.0005). Zero for 0 and inf."""
    if not math.isfinite(value) or value == 0:
        return 0.0
    second = 10.0 ** (math.floor(math.log10(abs(value))) - 1)
    return max(rel_tol * abs(value), 0.5 * second) * (1 + 1e-9)


def is_close(answer: float, value: float, rel_tol: float = 0.01) -> bool:
    """`answer` counts as `value` (see `window`); inf only matches inf."""
    if math.isinf(value) or math.isinf(answer):
        return math.isinf(value) and math.isinf(answer)
    if not math.isfinite(value):
        return False
    return abs(answer - value) <= window(value, rel_tol)


def rounds_to(answer: float, value: float) -> bool:
    """`answer` is `value` rounded to two or three significant figures (what a student who rounds writes)."""
    if not (math.isfinite(answer) and math.isfinite(value)) or value == 0:
        return False
    return any(math.isclose(answer, float(f"{value:.{k}g}"), rel_tol=1e-9) for k in (2, 3))


def nearest(answer: float, candidates, rel_tol: float = 0.01):
    """The (value, text) of `candidates` that `answer` is close to and nearest (relative distance),
    or None. Earlier candidates win ties, so put the right value first."""
    best, best_d = None, math.inf
    for value, text in candidates:
        if value is None or not is_close(answer, value, rel_tol):
            continue
        d = 0.0 if math.isinf(value) else abs(answer - value) / max(abs(value), 1e-300)
        if d < best_d:
            best, best_d = (value, text), d
    return best


def fmt(value: float, digits: int = 4) -> str:
    """A value for a reply: `digits` significant figures, "never" for inf."""
    return "never (math.inf)" if math.isinf(value) else f"{value:.{digits}g}"


def off_by(answer: float, right: float) -> str:
    """"about 3.2x too high", "12% too low": how far `answer` is from `right`."""
    if right == 0 or not math.isfinite(right):
        return "not it"
    ratio = answer / right
    if ratio <= 0:
        return "of the wrong sign"
    if 0.67 < ratio < 1.5:
        return f"{abs(ratio - 1):.0%} too {'high' if ratio > 1 else 'low'}"
    return f"about {max(ratio, 1 / ratio):.2g}x too {'high' if ratio > 1 else 'low'}"


# --- the slips every unit invites -----------------------------------------------------------------


def unit_slips(right: float, unit: str) -> list[tuple[float, str]]:
    """The values an answer takes when the right one, `right` in `unit`, is given in a neighbour
    unit, each with its hint. Units: "GB/s", "ms", "us", "bytes"; anything else has none."""
    if not math.isfinite(right) or right == 0:
        return []
    if unit == "GB/s":
        return [(right * 8, "that is 8 times the answer: gigabits per second (Gb/s). GB/s counts bytes, "
                           "8 bits each, and a link quoted in Gb/s carries 8 times fewer GB/s."),
                (right / 8, "that is the answer divided by 8: bytes taken for bits. GB/s counts bytes; "
                            "divide by 8 only to turn Gb/s into GB/s."),
                (right * GiB_PER_GB, "that is the answer in GiB/s (2^30 bytes). The lab's GB/s is decimal, "
                                     "1e9 bytes per second, as nccl-tests prints it (1 GB/s = 0.931 GiB/s)."),
                (right / GiB_PER_GB, "that is 1.0737 times the answer: 1024^3 used where GB means 1e9 bytes. "
                                     "The lab's GB/s is decimal, as nccl-tests prints it."),
                (right * 1e3, "that is 1000 times the answer: MB/s, not GB/s (1 GB/s = 1000 MB/s)."),
                (right / 1e3, "that is the answer / 1000: check the units, GB/s is 1e9 bytes per second "
                              "and times in ms are 1e-3 s.")]
    if unit == "ms":
        return [(right * 1e3, "that is 1000 times the answer: microseconds, not milliseconds "
                              "(1 ms = 1000 us)."),
                (right / 1e3, "that is the answer / 1000: seconds, not milliseconds (1 s = 1000 ms).")]
    if unit == "us":
        return [(right / 1e3, "that is the answer / 1000: milliseconds, not microseconds."),
                (right * 1e3, "that is 1000 times the answer: nanoseconds, not microseconds.")]
    if unit == "bytes":
        return [(right / 1e6, "that looks like megabytes (MB, 1e6 bytes); the answer is wanted in bytes."),
                (right / 2**20, "that looks like MiB (2^20 bytes); the answer is wanted in bytes."),
                (right / 1e9, "that looks like gigabytes (GB, 1e9 bytes); the answer is wanted in bytes."),
                (right / MiB_PER_MB, "that is 1.0486 times the answer: 1024 used where MB means 1e6 bytes "
                                     "(1 MB = 0.954 MiB)."),
                (right * MiB_PER_MB, "that is 0.954 times the answer: MB and MiB mixed up (1 MiB = "
                                     "1.0486 MB)."),
                (right * 1e3, "that is 1000 times the answer: check the units, GB/s is 1e9 bytes per "
                              "second and backward is in milliseconds."),
                (right / 1e3, "that is the answer / 1000: check the units, GB/s is 1e9 bytes per second "
                              "and times in ms are 1e-3 s.")]
    return []


# --- the shared grader ----------------------------------------------------------------------------


def grade(answer, right: float, slips, unit: str, how: str, *, rel_tol: float = 0.01, right_text: str = "",
          allow_inf: bool = False, allow_negative: bool = False, units: bool = True, digits: int = 4,
          fallback=None) -> str:
    """Judge a numeric answer against `right` (in `unit`) and the `slips` [(value, hint), ...].

    Reply: "Right: <precise value> <unit>. <right_text>" when the answer counts as `right`
    (`window`) and no slip is nearer; "Not yet (<answer>): <hint>" for the nearest close slip
    (`units` adds the unit slips of `unit_slips`); otherwise `fallback(value)` when given, else
    "Not yet (<answer>, <how far off>). <how>". One sentence for an unusable answer. Never raises.
    """
    value, hint = read_number(answer, unit, allow_inf=allow_inf or math.isinf(right), allow_negative=allow_negative)
    if value is None:
        return hint
    shown = f"{value:g} {unit}".strip()
    if math.isinf(right):
        if math.isinf(value):
            return f"Right: never (math.inf). {right_text}".strip()
        return f"Not yet ({shown}): here no finite value works, the answer is never (math.inf). {how}"
    if math.isinf(value):
        return f"Not yet: a finite answer exists here. {how}"
    slips = [(v, t) for v, t in slips if v is not None and math.isfinite(v)]
    if rounds_to(value, right):
        same = [t for v, t in slips if rounds_to(value, v)]
        note = (f" At the figures you gave, this slip rounds the same, so check you avoided it: {same[0]}"
                if same else "")
        return (f"Right: {fmt(right, digits)}{_in(unit)[3:] and ' ' + unit} (you wrote {value:g}). "
                f"{right_text}{note}").strip()
    candidates = [(right, None)] + slips
    unit_ones = unit_slips(right, unit) if units else []
    match = nearest(value, candidates + unit_ones, rel_tol)
    if match in unit_ones and is_close(value, right, rel_tol):
        match = (right, None)  # a unit's slip (1.0486, 1.0737) never overrules a rounded right answer
    if match is not None and match[1] is None:
        exact = "" if value == right else f" (you wrote {value:g})"
        return f"Right: {fmt(right, digits)}{_in(unit)[3:] and ' ' + unit}{exact}. {right_text}".strip()
    if match is not None:
        also = (f" (At two significant figures {value:g} could also be the right {fmt(right, digits)}: "
                "give three to tell them apart.)" if is_close(value, right, rel_tol) else "")
        return f"Not yet ({shown}): {match[1]}{also}"
    if fallback is not None:
        return fallback(value)
    return f"Not yet ({shown}, {off_by(value, right)}). {how}"


# --- predictions made before a measurement (every notebook asks for one before it measures) -------
def check_prediction(predicted, measured, unit: str, what: str, why: str = "", close_within: float = 0.25) -> str:
    """How far a prediction of `what` (in `unit`) was from the `measured` value; never raises.

    Within `close_within` (25 %): "Close". Otherwise the factor it was off by and `why` (what the
    measurement shows that a prediction tends to miss); a prediction off by a unit's factor (8 for
    Gb/s, 1000 for ms/us) says so. A missing prediction asks for one, a missing measurement says
    to run the cell above.
    """
    if predicted is None:
        return f"Write your prediction of {what} ({a_number(unit)}) before you run the measurement."
    guess, hint = read_number(predicted, unit)
    if guess is None:
        return f"Your prediction of {what}: {hint}"
    try:
        real = float(measured)
    except (TypeError, ValueError, OverflowError):
        real = math.nan
    if not math.isfinite(real) or real <= 0:
        return (f"There is no valid measurement to compare with yet (measured = {_shown(measured)}); run the cell "
                "above.")
    if guess == 0:
        return f"You predicted 0; the machine measured {real:.3g} {unit}.".replace(" .", ".")
    u = "x" if unit == "x" else f" {unit}".rstrip()
    where = f"you predicted {guess:.3g}{u}, the machine measured {real:.3g}{u}"
    off = guess / real
    if 1 / (1 + close_within) <= off <= 1 + close_within:
        return f"Close: {where} (within {abs(off - 1):.0%})."
    factor = off if off > 1 else 1 / off
    text = f"Off by {factor:.2g}x, too {'high' if off > 1 else 'low'}: {where}."
    for value, slip in unit_slips(real, unit):
        if abs(guess / value - 1) <= 0.1 and slip.startswith("that is"):
            text += " Your figure fits the measurement in another unit: " + slip
            break
    return text + (f" {why}" if why else "")
