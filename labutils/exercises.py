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

The numbers come from the model modules (budget, fit, collectives, ring, topology, doctor,
tensor_parallel, data_parallel); no formula is repeated here.
"""

from __future__ import annotations

import math

import numpy as np

from labutils import budget as bm
from labutils import hardware_ratio as hr
from labutils.busbw import bandwidths_GBps, bus_factor
from labutils.ddp_model import max_hidden_gradient_bytes, min_busbw_for_efficiency, predicted_efficiency
from labutils.doctor import case_inputs, diagnose
from labutils.doctor_evidence import path_band
from labutils.fit import allreduce_ms, latency_term_us
from labutils.inputs import check_range
from labutils.ring import ring_bytes_per_rank
from labutils.tensor_parallel import TOY_A, TOY_B, relu, toy_split, toy_whole, toy_wrong_split
from labutils.topology import choose_pair, classify, expected_figure, load_sample, pair_path, sample_pcie_gen

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
    number = _a_number(unit)
    if answer is None:
        return None, f"Replace None with your answer, {number}{never}."
    if isinstance(answer, bool):
        return None, f"{answer} is a yes/no, not a number; give {number}{never}."
    if isinstance(answer, (list, tuple, dict, set, np.ndarray)):
        return None, f"Give one number{_in(unit)}{never}, not {type(answer).__name__} {answer!r}."
    try:
        value = float(answer.strip() if isinstance(answer, str) else answer)
    except (TypeError, ValueError):
        return None, f"Give {number}{never}, not {answer!r}."
    if math.isnan(value):
        return None, f"NaN is not an answer; give {number}{never}."
    if math.isinf(value) and not (allow_inf and value > 0):
        return None, f"{answer!r} is not an answer here; give a finite number{_in(unit)}."
    if value < 0 and not allow_negative:
        return None, f"{value:g} cannot be right: the answer is a positive number{_in(unit)}{never}."
    if value == 0 and not allow_zero:
        return None, f"0 cannot be right: the answer is a positive number{_in(unit)}{never}."
    return value, ""


def _in(unit: str) -> str:
    return f" in {unit}" if unit and unit != "x" and not unit.startswith("whole number") else ""


def _a_number(unit: str) -> str:
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
        return f"Right: {fmt(right, digits)}{_in(unit)[3:] and ' ' + unit} (you wrote {value:g}). {right_text}{note}".strip()
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


# --- predictions made before measuring -------------------------------------------------------------


def check_prediction(predicted, measured, unit: str, what: str, why: str = "", close_within: float = 0.25) -> str:
    """How far a prediction of `what` (in `unit`) was from the `measured` value; never raises.

    Within `close_within` (25 %): "Close". Otherwise the factor it was off by and `why` (what the
    measurement shows that a prediction tends to miss); a prediction off by a unit's factor (8 for
    Gb/s, 1000 for ms/us) says so. A missing prediction asks for one, a missing measurement says
    to run the cell above.
    """
    if predicted is None:
        return f"Write your prediction of {what} ({_a_number(unit)}) before you run the measurement."
    guess, hint = read_number(predicted, unit)
    if guess is None:
        return f"Your prediction of {what}: {hint}"
    try:
        real = float(measured)
    except (TypeError, ValueError):
        real = math.nan
    if not math.isfinite(real) or real <= 0:
        return f"There is no valid measurement to compare with yet (measured = {measured!r}); run the cell above."
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


def check_ratio_prediction(predicted, measured: float, what: str = "hand ring time / gloo all_reduce time") -> str:
    """Notebook 03: the predicted ratio hand ring / gloo all_reduce time against the measured one."""
    why = ("Hint: the library's all-reduce is the same ring (or a smarter algorithm) in C++, without a Python call "
           "per step: small messages pay the per-step overhead 2(N-1) times in the hand ring, large ones are "
           "limited by the same bytes on the same links.")
    return check_prediction(predicted, measured, "x", f"the ratio {what}", why)


# --- 01 · topology ----------------------------------------------------------------------------------


def check_pair_choice(sample: str, pair, busbw_GBps=None) -> str:
    """Notebook 01: is `pair` (two GPU indices or names) a fastest pair of the sample topology
    `sample`, and is `busbw_GBps` what its path is expected to carry?

    Where the path's figure is a measured busbw (SYS: the source article's 22 GB/s on PCIe 5.0,
    measured on `two_gpu_sys`'s very machine) the answer must be within 10 % of it; where it is a
    specification band (PIX, NV#, ...) it must lie in [low, high] (two significant figures of slack).
    Hints: another generation's band, both directions added, Gb/s, the other socket's figure.
    """

    try:
        topo, gen = load_sample(sample), sample_pcie_gen(sample)
    except Exception as exc:  # noqa: BLE001 - a grader answers, never raises
        return f"There is no sample topology {sample!r} ({exc})."
    try:
        a, b = pair
        mine = pair_path(topo, a, b, gen)
    except Exception as exc:  # noqa: BLE001
        return f"Not yet: give two different GPU indices of {sample}, e.g. (0, 1), not {pair!r} ({exc})."
    best = choose_pair(topo, pcie_gen=gen).best
    if mine.rank < best.rank:
        return (f"Not yet: {mine.a}-{mine.b} reads {mine.code} ({mine.path_class}). Some pair on this "
                f"machine is joined by a faster code; in the legend's order NV# > PIX > PXB > PHB > NODE > SYS. "
                f"Scan the rows for the best code you can find.")
    text = f"Good pair: {mine.a}-{mine.b} reads {mine.code}, {mine.path_class}, the fastest path here."
    if busbw_GBps is None:
        return text + " Now estimate the busbw you expect from the link table (in GB/s)."
    value, hint = read_number(busbw_GBps, "GB/s", allow_zero=False)
    if value is None:
        return f"{text} But the busbw: {hint}"
    fig = expected_figure(mine.code, gen)
    measured = fig.kind.startswith("measured")
    low, high = fig.low_GBps, fig.high_GBps
    if measured:
        right, ok = low, is_close(value, low, 0.1)
        expect = f"{low:g} GB/s, the source article's measured busbw on this path"
    else:
        ok = low - window(low) <= value <= high + window(high)
        right, expect = None, f"{low:g}-{high:g} GB/s, {fig.name}"
    slips = []
    if measured:
        clean = fig.high_GBps
        slips.append((clean, (clean * 0.95, clean * 1.27), f"that is a clean PCIe {gen}.0 link; across sockets "
                      f"the article measured {low:g} GB/s on this machine."))
        slips.append((low / 2, (low / 2 * 0.9, low / 2 * 1.1), "that halves the measured figure; with N = 2 the "
                      "ring factor 2(N-1)/N is 1 and busbw equals the article's figure."))
    for other in (3, 4, 5):
        if other != gen and not mine.code.startswith("NV"):
            o = expected_figure(mine.code, other)
            slips.append(((o.low_GBps + o.high_GBps) / 2, (o.low_GBps, o.high_GBps),
                          f"that is the PCIe {other}.0 figure ({o.low_GBps:g}-{o.high_GBps:g} GB/s); this "
                          f"machine's GPUs use PCIe {gen}.0."))
    slips.append((2 * high, (2 * low, 2 * high), "that adds both directions; busbw is per direction, as the link "
                                                 "table's figures are."))
    slips.append((8 * high, (8 * low, 8 * high), "that is gigabits (Gb/s); GB/s counts bytes, 8 bits each."))
    if ok:
        return text + f" And {value:g} GB/s is right: expect {expect}."
    for _, (lo, hi), slip in slips:
        if lo * 0.97 <= value <= hi * 1.03:
            return text + f" But {value:g} GB/s: {slip} Expect {expect}."
    if measured and value > right:
        return (text + f" But {value:g} GB/s is more than was measured on this very path ({expect}); a "
                "measurement beats any estimate from the specification.")
    if value > high:
        return (text + f" But {value:g} GB/s is above what this path carries ({expect}); busbw cannot beat "
                "the wire.")
    return (text + f" But {value:g} GB/s is too pessimistic: look up the path in the link table; expect "
            f"{expect}.")


def _planted_truth(case: str) -> dict:
    """The planted GPU of a doctor case, its nearest neighbour, and the pair's band now and at full speed."""

    inputs = case_inputs(case)
    topo, facts = inputs["topo"], inputs["facts"]
    planted = next(f for f in facts.gpus if (f.pcie_gen or 0) < (f.pcie_gen_max or 0)
                   or (f.pcie_width or 0) < (f.pcie_width_max or 0))
    gpu = planted.index
    partner = max((j for j in range(len(topo.gpus)) if j != gpu), key=lambda j: (classify(topo.link(gpu, j))[0], -j))
    now = diagnose(**{**inputs, "gpus": (gpu, partner), "measurement": None})
    full = path_band(topo.link(gpu, partner), planted.pcie_gen_max, planted.pcie_width_max)
    return {"gpu": gpu, "partner": partner, "high": now.expected_GBps[1], "low": now.expected_GBps[0],
            "full": full.high_GBps, "planted": planted, "facts": facts}


def _as_gpu(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip().upper().removeprefix("GPU")
        return int(text) if text.isdigit() else None
    if isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def check_planted_fault(gpu, ceiling_GBps=None, case: str = "exercise_downtrained") -> str:
    """Notebook 01: which GPU's link was planted downtrained in the doctor's `case`, and what is now
    the most busbw (the band's high end, GB/s) a 2-GPU job between it and its nearest neighbour
    can reach? Hints: the full-speed band, the low end, Gb/s, GiB/s."""
    try:
        t = _planted_truth(case)
    except Exception as exc:  # noqa: BLE001
        return f"There is no planted-fault case {case!r} ({exc})."
    facts, planted, n = t["facts"], t["planted"], len(t["facts"].gpus)
    index = _as_gpu(gpu)
    if index is None:
        return (f"Give the GPU's index as a whole number (0 to {n - 1}), not {gpu!r}: find the row of the table "
                "where pcie_gen is below pcie_gen_max, or pcie_width below pcie_width_max.")
    if not 0 <= index < n:
        return f"There is no GPU{index} in this sample: its GPUs are GPU0..GPU{n - 1}."
    if index != t["gpu"]:
        f = facts.gpus[index]
        return (f"Not yet: GPU{index} runs gen {f.pcie_gen} of {f.pcie_gen_max} at x{f.pcie_width} of "
                f"x{f.pcie_width_max}, as it should. Compare the current and maximum columns row by row.")
    found = (f"Right GPU: GPU{index} runs PCIe gen {planted.pcie_gen} of its maximum {planted.pcie_gen_max} "
             f"(x{planted.pcie_width} of x{planted.pcie_width_max}).")
    if ceiling_GBps is None:
        return found + (f" Now the ceiling: what is the most busbw GPU{index} and its neighbour GPU{t['partner']} "
                        "can reach now (the high end of the link table's band, in GB/s)?")
    how = (f"take the link table's PCIe {planted.pcie_gen}.0 x16 row (its high end) and scale it by the width, "
           f"x{planted.pcie_width} / x16.")
    slips = [(t["full"], f"{t['full']:g} GB/s is what the link carries at gen {planted.pcie_gen_max}; it trained at "
                         f"gen {planted.pcie_gen}. Look up that row of the link table."),
             (t["low"], f"{t['low']:g} GB/s is the band's low (typical) end; the question asks for its high end.")]
    reply = grade(ceiling_GBps, t["high"], slips, "GB/s", how, rel_tol=0.03,
                  right_text=f"The PCIe {planted.pcie_gen}.0 x{planted.pcie_width} band's high end. Now run the "
                             "doctor on it and compare.")
    if reply.startswith("Right"):
        return f"{found} And the ceiling is right: {reply[len('Right: '):]}"
    if reply.startswith("Not yet"):
        return f"{found} But the ceiling is not yet right{reply[len('Not yet'):]}"
    return f"{found} The ceiling: {reply}"


# --- 02 · the sweep ----------------------------------------------------------------------------------


def check_busbw(answer_GBps, op: str, size_bytes: float, time_us: float, world_size: int) -> str:
    """Notebook 02: the busbw nccl-tests would print for one row (size, time, N ranks) of `op`.

    busbw = size / time x factor(op, N). Slips: algbw, the factor divided, all_reduce's factor
    for another op, the time read in ms or s, 1024 for 1000 (the size in MiB), Gb/s, GiB/s.
    """
    try:
        algbw, right = bandwidths_GBps(op, size_bytes, time_us, world_size)
        factor = bus_factor(op, world_size)
    except Exception as exc:  # noqa: BLE001
        return f"The row cannot be graded ({exc})."
    slips = []
    if factor != 1:
        slips += [(algbw, f"that is algbw = size / time. Multiply by the {op} factor for N = {world_size} "
                          f"({factor:.4g}) to get busbw."),
                  (algbw / factor, f"you divided by the factor; busbw = algbw x {factor:.4g}, the rate the "
                                   "busiest link ran at, is the larger one here.")]
    ar = bus_factor("all_reduce", world_size)
    if op != "all_reduce" and ar != factor:
        slips.append((algbw * ar, f"that uses all_reduce's factor 2(N-1)/N; {op}'s factor is {factor:.4g} "
                                  "(doc/PERFORMANCE.md of nccl-tests)."))
    slips += [(right / 1e3, "that is the answer / 1000: time_us is in microseconds (1e-6 s), not milliseconds."),
              (right * MiB_PER_MB, "that counts the size in MiB (1024^2 bytes) where GB/s wants decimal bytes "
                                   "(1e9 per GB).")]
    how = (f"algbw = size_bytes / (time_us x 1e-6) / 1e9 GB/s; then busbw = algbw x factor, the factor of {op} on "
           f"{world_size} ranks.")
    return grade(answer_GBps, right, slips, "GB/s", how,
                 right_text=f"algbw {algbw:.4g} GB/s times {factor:.4g}, the rate the busiest link ran at.")


# --- 03 · the ring by hand ----------------------------------------------------------------------------


def check_ring_bytes(answer_bytes, size_bytes: float = 1e8, world_size: int = 8) -> str:
    """Notebook 03: bytes each rank sends in a ring all-reduce, 2(N-1)/N x size."""
    n = int(world_size)
    right = float(ring_bytes_per_rank(size_bytes, n))
    slips = [((n - 1) / n * size_bytes, "that is one phase only; the all-gather sends as much again."),
             (size_bytes / n, "that is one chunk, one step; there are 2(N-1) steps."),
             (2 * size_bytes, "that is the limit for very many ranks; at this N the factor is 2(N-1)/N."),
             ((n - 1) * size_bytes, "that is what rank 0 would receive in the naive gather-to-one."),
             (size_bytes, "that is the buffer once; each rank sends 2(N-1) chunks of size/N.")]
    return grade(answer_bytes, right, slips, "bytes", "Each of the 2(N-1) steps sends one chunk of size/N bytes.",
                 rel_tol=0.005, right_text=f"2(N-1)/N x size = {2 * (n - 1)}/{n} x {size_bytes:.4g}.")


def check_ring_steps(answer_steps, world_size: int = 8) -> str:
    """Notebook 03: the point-to-point steps in a row of a ring all-reduce, 2(N-1) (exact)."""
    n = int(world_size)
    answer, hint = read_whole(answer_steps, "steps")
    if answer is None:
        return hint
    right = 2 * (n - 1)
    if answer == right:
        return f"Right: N-1 = {n - 1} reduce-scatter steps and {n - 1} all-gather steps, {right} in a row."
    slips = {n - 1: "that is one phase; the all-gather takes as many steps again.",
             2 * math.ceil(math.log2(n)): "that is a tree's count (up and down, log2 N each way); the ring passes "
                                          "every rank.",
             n: "that is one step per rank; each phase takes N-1 steps (a rank never sends to itself), and there "
                "are two phases.",
             2 * n: "that counts N steps per phase; each phase takes N-1 (a rank never sends to itself)."}
    if answer in slips:
        return f"Not yet ({answer}): {slips[answer]}"
    return f"Not yet ({answer}). Count the panels of the drawing above for N = 4, then generalise."


# --- 04 · predicting all-reduce ------------------------------------------------------------------------


def check_allreduce_prediction(answer_ms, size_bytes: float, world_size: int, busbw_GBps: float) -> str:
    """Notebook 04: the bandwidth-only all-reduce time 2(N-1)/N x bytes / busbw, in ms.

    Slips: the factor left out, one phase ((N-1)/N), the answer in s or us, busbw read as Gb/s
    or GiB/s, the factor's limit 2."""
    try:
        check_range("busbw_GBps", busbw_GBps, low=0, low_open=True, high=math.inf, high_open=True, unit="GB/s")
        right = float(allreduce_ms(size_bytes, world_size, busbw_GBps))
        factor = bus_factor("all_reduce", world_size)
        bare = size_bytes / (busbw_GBps * 1e6)
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [(bare, f"that is bytes / busbw alone; multiply by the ring factor 2(N-1)/N = {factor:.4g}."),
             (bare * factor / 2, "that is one phase, (N-1)/N; reduce-scatter and all-gather each move as much."),
             (2 * bare, "that uses the factor's limit 2; at this N it is 2(N-1)/N."),
             (right * 8, "that is 8 times the answer: busbw read as gigabits (Gb/s); GB/s counts bytes."),
             (right / GiB_PER_GB, "that is 1.0737 times the answer: GiB (2^30 bytes) used for GB (1e9 bytes).")]
    how = "Compute factor = 2(N-1)/N, then factor x bytes / (busbw x 1e9) seconds, then convert to ms."
    tail = ("With one rank nothing travels: the factor 2(N-1)/N is 0." if factor == 0 else
            "Doubling N from here barely changes it: the factor tends to 2." if factor >= 1.5 else
            f"The factor is {factor:.4g} here and tends to 2 as N grows.")
    return grade(answer_ms, right, slips, "ms", how, right_text=tail)


def ring_latency_ranks(alpha_step_us: float = 5.0, limit_us: float = 100.0, algorithm: str = "ring") -> int:
    """The smallest N whose latency term (`fit.latency_term_us`) is strictly above `limit_us`."""
    n = 2
    while latency_term_us(n, alpha_step_us, algorithm) <= limit_us:
        n += 1
    return n


def check_ring_latency_ranks(answer, alpha_step_us: float = 5.0, limit_us: float = 100.0,
                             table_ns=(2, 4, 8, 16, 32, 64, 128)) -> str:
    """Notebook 04: the smallest whole N (any N, not only the table's) at which a ring's latency term
    2(N-1) x alpha_step is more than `limit_us`. Slips: "at least" for "more than", the table's
    rows, one phase, N steps, the tree."""
    value, hint = read_whole(answer, "ranks", low=1)
    if value is None:
        return hint
    right = ring_latency_ranks(alpha_step_us, limit_us)
    if value == right:
        return (f"Right: N = {right}, 2({right}-1) x {alpha_step_us:g} = "
                f"{latency_term_us(right, alpha_step_us):g} us > {limit_us:g} us; N = {right - 1} gives "
                f"{latency_term_us(right - 1, alpha_step_us):g} us.")
    above = [n for n in table_ns if n > right]
    below = [n for n in table_ns if n < right]
    slips = {}
    if latency_term_us(right - 1, alpha_step_us) == limit_us:
        slips[right - 1] = (f"at N = {right - 1} the term is exactly {limit_us:g} us; the question asks for more "
                            "than that.")
    if above:
        slips.setdefault(above[0], f"{above[0]} is the first row of the table above {limit_us:g} us, but N need not "
                                   "be a power of two: solve 2(N-1) x alpha_step > limit for a whole N.")
    if below:
        slips.setdefault(below[-1], f"at N = {below[-1]} the term is {latency_term_us(below[-1], alpha_step_us):g} "
                                    f"us, not yet above {limit_us:g}.")
    k = 1
    while (k - 1) * alpha_step_us <= limit_us:
        k += 1
    slips.setdefault(k, "that counts one phase, N-1 steps; the ring's latency term is 2(N-1) steps.")
    k = 1
    while k * alpha_step_us <= limit_us:
        k += 1
    slips.setdefault(k, "that counts N steps; the ring takes 2(N-1) steps, N-1 per phase.")
    tree = ring_latency_ranks(alpha_step_us, limit_us, "tree") if limit_us / alpha_step_us < 60 else None
    if tree:
        slips.setdefault(tree, "that is the tree's N (2 log2 N steps); the question is about the ring.")
    if value in slips:
        return f"Not yet ({value}): {slips[value]}"
    return (f"Not yet ({value}: the term is {latency_term_us(value, alpha_step_us):g} us). Solve "
            f"2(N-1) x {alpha_step_us:g} us > {limit_us:g} us for the smallest whole N.")


# --- 05 · tensor parallel -------------------------------------------------------------------------------


def check_toy_contribution(answer, x=((-1, 2),)) -> str:
    """Notebook 05: device 2's contribution ReLU(x A[:, 2:4]) B[2:4, :] for a new input x.

    Recognises the usual slips (no ReLU, device 1's part, the whole output, the wrong split, B's
    other rows) and answers with a hint rather than right/wrong."""
    x = np.asarray(x, dtype=np.int64).reshape(1, 2)
    if answer is None:
        return "Replace None with device 2's contribution, two numbers such as [a, b]."
    if isinstance(answer, (str, bytes, dict, set, bool)):
        return f"Give two numbers in a list, e.g. [a, b], not {answer!r}."
    try:
        got = np.asarray(answer, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        return f"Give two numbers, e.g. [a, b], not {answer!r}."
    if got.size != 2:
        return f"Device 2's contribution is a 1x2 row (two numbers); got {got.size} number(s)."
    if not np.isfinite(got).all():
        return f"Both numbers must be finite; got {got.tolist()}."
    right = toy_split(x).contributions[1].reshape(-1)
    if np.array_equal(got, right):
        other = toy_split(x).contributions[0].reshape(-1).tolist()
        return (f"Right: {right.tolist()}. Add device 1's {other} and you "
                f"get the whole output {toy_whole(x).reshape(-1).tolist()}, which is what the all-reduce delivers.")
    one_based = relu(x @ TOY_A[:, 1:3]) @ TOY_B[1:3, :]
    from_one = ("count columns from 0, as the tables above do: device 2 owns A's last two columns (2 and 3) and "
                "B's last two rows.")
    if np.array_equal(one_based, toy_whole(x)):
        from_one = ("That is the whole output, and also what A's columns 1-2 and B's rows 1-2 give: if you counted "
                    "from 1, " + from_one + " If you summed both devices, the question asks for device 2's part "
                    "alone.")
    else:
        from_one = "That is A's columns 1-2 and B's rows 1-2: " + from_one
    slips = [(one_based, from_one),
             ((x @ TOY_A[:, 2:4]) @ TOY_B[2:4, :], "You skipped ReLU: clip device 2's hidden values "
              "x A[:, 2:4] at zero before multiplying by B's rows 2 and 3."),
             (toy_split(x).contributions[0], "That is device 1's part (columns 0-1 of A, rows 0-1 of B). "
              "Device 2 owns columns 2-3 of A and rows 2-3 of B."),
             (toy_whole(x), "That is the whole output, the sum after the all-reduce; the question asks "
              "for device 2's part alone."),
             (toy_wrong_split(x).contributions[1], "That is the wrong split (A cut by rows): device 2 would "
              "hold partial pre-activations, and ReLU of a partial sum is not a part of ReLU of the sum."),
             (relu(x @ TOY_A[:, 2:4]) @ TOY_B[:2, :], "Use B's rows 2 and 3, the rows that meet device 2's "
              "hidden columns, not rows 0 and 1.")]
    for expected, hint in slips:
        if np.array_equal(got, np.asarray(expected).reshape(-1)):
            return f"Not yet: {hint}"
    return (f"Not yet ({got.tolist()}). Step by step: h = x A[:, 2:4] (two numbers), clip at zero, "
            "then h B[2:4, :] (two numbers).")


# --- 06 · the time budget ---------------------------------------------------------------------------------


def check_break_even(answer_ms, *, eta=0.8, Q=4, latency_ms=0.03, volume_bytes=2_000_000,
                     bandwidth_GBps=10.0) -> str:
    """Notebook 06: the break-even C (ms) C* = H / (1 - 1/(2 eta)), H = Q (l + V/B).

    Slips: H itself, H multiplied by the saved share, the startup left out, V/B left out, the
    base case's H, the 2 of 2 eta dropped, the units of V/B."""
    try:
        right = float(bm.break_even_C_ms(eta, Q, latency_ms, volume_bytes, bandwidth_GBps))
        H = float(bm.comm_ms(Q, latency_ms, volume_bytes, bandwidth_GBps))
        frac = float(bm.saved_fraction(eta))
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    base = {k: bm.BASE_CASE[k] for k in ("eta", "Q", "latency_ms", "volume_bytes", "bandwidth_GBps")}
    slips = [(H, "that is H, the communication; divide it by the share of C that splitting saves, 1 - 1/(2 eta)."),
             (H * frac, "you multiplied H by 1 - 1/(2 eta); divide instead."),
             (float(bm.break_even_C_ms(eta, Q, 0.0, volume_bytes, bandwidth_GBps)),
              "you left out the startup cost l of each exchange."),
             (float(bm.break_even_C_ms(eta, Q, latency_ms, 0.0, bandwidth_GBps)),
              "you left out the transfer V/B of each exchange."),
             (float(bm.break_even_C_ms(**base)), "that is the base case; recompute H with this exercise's Q, V and B."),
             (H * 2 * eta, "1/(2 eta) is the share of C each device still computes; divide H by the saved share "
                           "1 - 1/(2 eta)."),
             (float(bm.break_even_C_ms(eta, Q, latency_ms, volume_bytes * 1e3, bandwidth_GBps)),
              "V/B came out 1000 times too large: V bytes at B GB/s take V / (B 1e6) ms."),
             (float(bm.break_even_C_ms(eta, Q, latency_ms, volume_bytes * 8, bandwidth_GBps)),
              "V/B came out 8 times too large: B is in gigabytes per second, not gigabits.")]
    how = "compute H = Q (l + V / (B 1e6)) ms first, then C* = H / (1 - 1/(2 eta))."
    return grade(answer_ms, right, slips, "ms", how, allow_inf=True,
                 right_text="Below it, splitting costs more than it saves.")


def check_min_bandwidth(answer_GBps, *, C_ms=12.0, eta=0.8, Q=4, latency_ms=0.03, volume_bytes=2_000_000) -> str:
    """Notebook 06: the minimum bandwidth B = V / (D 1e6) GB/s, D = C (1 - 1/(2 eta)) / Q - l.

    Slips: the startup left out, the saving not shared among the Q exchanges, 1 - 1/eta, and the
    units (GB/s vs Gb/s, MB/s, GiB/s)."""
    try:
        right = float(bm.min_bandwidth_GBps(C_ms, eta, Q, latency_ms, volume_bytes))
        saving = C_ms * float(bm.saved_fraction(eta))
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [(float(bm.min_bandwidth_GBps(C_ms, eta, Q, 0.0, volume_bytes)),
              "you left out the startup: D = C (1 - 1/(2 eta)) / Q - l."),
             (volume_bytes / ((saving - latency_ms) * 1e6) if saving > latency_ms else None,
              "share the saving among the Q exchanges: divide C (1 - 1/(2 eta)) by Q before subtracting l."),
             (volume_bytes / ((C_ms / (2 * eta) / Q - latency_ms) * 1e6) if C_ms / (2 * eta) / Q > latency_ms
              else None, "1/(2 eta) is the share of C each device still computes; the saving is C (1 - 1/(2 eta)).")]
    how = "D = C (1 - 1/(2 eta)) / Q - l (ms), then B = V / (D 1e6) GB/s; never (math.inf) if D <= 0."
    return grade(answer_GBps, right, slips, "GB/s", how, allow_inf=True,
                 right_text="Any slower link makes the split lose.")


def check_critical_hidden(answer, *, compute_TFLOPs=312.0, bandwidth_GBps=24.0, eta=0.8, N=2, Q=1,
                          wire_dtype="bf16", ffn_ratio=4.0) -> str:
    """Notebook 06: the critical hidden size h* = I* w / (4 r) (startups left out).

    Slips: I* itself, R/B without the saved share, the wire dtype, the link's Gb/s taken as GB/s
    (8x), and bytes for bits the other way."""
    try:
        right = float(hr.critical_hidden(compute_TFLOPs, bandwidth_GBps, eta, N, Q, wire_dtype, ffn_ratio))
        w = bm.WIRE_DTYPES[bm.wire_dtype_name(wire_dtype)]
        intensity = float(hr.critical_intensity(compute_TFLOPs, bandwidth_GBps, eta, N, Q))
        ratio = float(hr.hardware_ratio(compute_TFLOPs, bandwidth_GBps))
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [(intensity, "that is I*, FLOP per byte; turn it into a hidden size: h* = I* x w / (4 r)."),
             (ratio * w / (4 * ffn_ratio), "you used R/B alone; divide by the saved share 1 - 1/(N eta) (and "
                                           "multiply by Q x 2(N-1)/N)."),
             (right * 4 / w if w != 4 else None, "check the wire dtype: V_w counts w bytes per value (2 for bf16, "
                                                 "4 for fp32)."),
             (right / 8, "the link's bandwidth came out 8 times too high: a port quoted in Gb/s (gigabits) "
                         "carries 8 times fewer GB/s."),
             (right * 8, "the link's bandwidth came out 8 times too low: GB/s counts bytes; divide by 8 only to "
                         "turn Gb/s into GB/s.")]
    how = ("R/B = TFLOP/s x 1e12 / (GB/s x 1e9) FLOP per byte; I* = Q x 2(N-1)/N / (1 - 1/(N eta)) x R/B; "
           "h* = I* x w / (4 r).")
    return grade(answer, right, slips, "", how, allow_inf=True, units=False,
                 right_text=(f"I* = {intensity:.5g} FLOP per byte on the wire. Below it the all-reduce costs more "
                             "than the split saves."))


# --- 07 · validating the budget -------------------------------------------------------------------------


def check_t2_prediction(answer_ms, inputs) -> str:
    """Notebook 07: T2 = S + C/(2 eta) + Q (l + V/B), in ms, from `inputs` (validation.BudgetInputs).

    The tolerance comes from the slips, not a fixed percentage: each slip (eta left out, the
    latency, V/B, S or the whole communication left out, V/B off by 1000 or 8) is a candidate and
    the answer is matched to the nearest one it is close to. An answer that left out V/B, even
    when V/B is 1 % of T2, is nearer that slip than the right value and is told so.
    """
    try:
        S, C, eta, Q, lat, V, B = (float(v) for v in inputs.as_args())
        right = float(bm.t_two_ms(S, C, eta, Q, lat, V, B))
        wire_ms = float(bm.comm_ms(1, 0.0, V, B))
    except Exception as exc:  # noqa: BLE001
        return f"These inputs cannot be graded ({exc})."
    slips = [(right - C / (2 * eta) + C / 2, f"you used C/2: divide by 2 eta (eta = {eta:.3g}), the split's halves "
                                             "do not run at full efficiency."),
             (right - Q * lat, "the latency is missing: every all-reduce pays it once, whatever its size."),
             (right - Q * wire_ms, "the bandwidth term V/B is missing (or came out in seconds): V bytes at B GB/s "
                                   "take V / (B 1e9) s, that is V / (B 1e6) ms."),
             (right - S, "S is missing: the serial work is in T2 too."),
             (right + Q * wire_ms * 999, "V/B came out 1000 times too large: V / (B 1e9) is in seconds, "
                                         "V / (B 1e6) in ms."),
             (right + Q * wire_ms * 7, "V/B came out 8 times too large: B is in gigabytes per second, not gigabits."),
             (right - Q * (lat + wire_ms), "the communication is missing: Q (latency + V/B)."),
             (S + C, "that is T1, one device's time; T2 splits C over two devices and adds the communication.")]
    how = "Add three parts: S, C / (2 eta), and Q (latency + V / B) with V/B converted to ms."
    return grade(answer_ms, right, slips, "ms", how, rel_tol=0.001,
                 right_text=f"of which {Q * (lat + wire_ms):.4g} ms is communication; the one-rank time is "
                            f"{S + C:.4g} ms.")


# --- 08 · data-parallel training --------------------------------------------------------------------------


def _size_text(n_bytes: float) -> str:
    return f"{n_bytes:.4g} bytes ({n_bytes / 1e6:.4g} MB, {n_bytes / 2**20:.4g} MiB)"


def check_hidden_gradient(answer_bytes, backward_ms: float, busbw_GBps: float, world_size: int,
                          compute_ms: float | None = None) -> str:
    """Notebook 08: the largest gradient (bytes) whose all-reduce ideal overlap hides behind
    backward: V = backward x busbw 1e6 / (2(N-1)/N). Slips: the factor, the whole step for the
    backward, MB / MiB for bytes, ms taken as s, Gb/s."""
    try:
        right = float(max_hidden_gradient_bytes(backward_ms, busbw_GBps, world_size))
        factor = float(bus_factor("all_reduce", world_size))
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [(right * factor if factor != 1 else None,
              "you let the whole buffer cross the link at busbw. Each rank moves 2(N-1)/N of it: divide by that "
              "factor."),
             (right / factor if factor != 1 else None, "you multiplied by 2(N-1)/N; the time is 2(N-1)/N x V / "
                                                       "busbw, so V = time x busbw / (2(N-1)/N)."),
             (right * compute_ms / backward_ms if compute_ms else None,
              "only the backward pass can hide the all-reduce: DDP sends a bucket once its gradients exist, and "
              "they exist only during backward. Use the backward time, not the whole step."),
             (right / 8, "that is the answer / 8: busbw is in gigabytes per second, not gigabits.")]
    how = "Set the all-reduce time 2(N-1)/N x V / (busbw x 1e6) ms equal to the backward time and solve for V."
    return grade(answer_bytes, right, slips, "bytes", how, rel_tol=0.02,
                 right_text=(f"That is {_size_text(right)}. A larger gradient leaves part of its all-reduce "
                             "exposed even with perfect overlap."))


def check_min_busbw(answer_GBps, gradient_bytes: float, compute_ms: float, world_size: int,
                    efficiency: float = 0.9) -> str:
    """Notebook 08: the slowest link (GB/s) that keeps a weak-scaling efficiency without overlap.

    comm <= c (1/E - 1), B = 2(N-1)/N V / (comm 1e6). Slips: comm = c (1 - E), the factor,
    Gb/s, GiB/s, MB/s; other answers are told the efficiency they would give."""
    try:
        right = float(min_busbw_for_efficiency(gradient_bytes, compute_ms, world_size, efficiency))
        factor = float(bus_factor("all_reduce", world_size))
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    slips = [(right * (1 / efficiency - 1) / (1 - efficiency) if efficiency < 1 else None,
              f"you took comm = c (1 - {efficiency:g}); the efficiency is c / (c + comm), so comm = "
              f"c (1/{efficiency:g} - 1)."),
             (right / factor if factor != 1 else None, "you left out the ring factor: the all-reduce moves "
                                                       "2(N-1)/N x V over each link.")]

    def fallback(value: float) -> str:
        got = float(predicted_efficiency(gradient_bytes, value, compute_ms, world_size)) if value > 0 else 0.0
        if value < right:
            return (f"Not yet ({value:g} GB/s): too slow, at {value:g} GB/s the efficiency is {got:.1%}. Solve "
                    f"c / (c + comm) = {efficiency:g} for comm first, then the bandwidth that moves 2(N-1)/N x "
                    "bytes in that time.")
        return (f"Not yet ({value:g} GB/s): that link is enough ({got:.1%}), but slower ones are too: the question "
                "asks for the smallest. Set c / (c + comm) equal to the target and solve for the bandwidth.")

    return grade(answer_GBps, right, slips, "GB/s", "", allow_inf=True, fallback=fallback,
                 right_text=f"Any slower link drops below {efficiency:.0%} (gradient {_size_text(gradient_bytes)}).")


# Every grader of the lab (a test checks that no other module defines one).
GRADERS = ("check_prediction", "check_ratio_prediction", "check_pair_choice", "check_planted_fault", "check_busbw",
           "check_ring_bytes", "check_ring_steps", "check_allreduce_prediction", "check_ring_latency_ranks",
           "check_toy_contribution", "check_break_even", "check_min_bandwidth", "check_critical_hidden",
           "check_t2_prediction", "check_hidden_gradient", "check_min_busbw")
