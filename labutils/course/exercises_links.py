"""Graders of notebooks 01-04 (topology, the sweep, the ring by hand, predicting all-reduce) and the
prediction checks every notebook uses; imported through labutils.course.exercises.
"""

from __future__ import annotations

import math

import numpy as np

from labutils.core.busbw import bandwidths_GBps, bus_factor
from labutils.core.inputs import check_range
from labutils.course.grading import (
    GiB_PER_GB,
    MiB_PER_MB,
    _a_number,
    grade,
    is_close,
    read_number,
    read_whole,
    unit_slips,
    window,
)
from labutils.doctor.doctor import case_inputs, diagnose
from labutils.doctor.evidence import path_band
from labutils.model.fit import allreduce_ms, latency_term_us
from labutils.model.ring import ring_bytes_per_rank
from labutils.readers.topology import choose_pair, classify, expected_figure, load_sample, pair_path, sample_pcie_gen

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
