"""Graders of notebook 01 (topology): the fastest pair of a sample machine and the busbw its path
carries, and the GPU whose link the doctor's exercise case planted downtrained, with its ceiling.
Files only: grading reads the shipped case, never this machine."""

from __future__ import annotations

import numpy as np

from labutils.course.grading import grade, read_number, window
from labutils.doctor.cases import case_inputs
from labutils.doctor.evidence import path_band
from labutils.readers.topology import choose_pair, classify, expected_figure, load_sample, pair_path, sample_pcie_gen


def check_pair_choice(sample: str, pair, busbw_GBps=None) -> str:
    """Notebook 01: is `pair` (two GPU indices or names) a fastest pair of the sample topology
    `sample`, and is `busbw_GBps` what its path is expected to carry?

    Where the path's figure is a measured busbw (SYS: the source article's 22 GB/s on PCIe 5.0,
    measured on `two_gpu_sys`'s very machine) the answer must be it to two significant figures
    (`grading.grade`; GiB/s, Gb/s and the slips below are named); where it is a band (PIX, NV#,
    ...) it must lie in [low, high] (two significant figures of slack). GPU indices may be given
    as ints, numpy integers, whole floats or strings ("5", "5.0", "GPU5").
    Hints: another generation's band, both directions added, Gb/s, the clean link's figure.
    """

    try:
        topo, gen = load_sample(sample), sample_pcie_gen(sample)
    except Exception as exc:  # noqa: BLE001 - a grader answers, never raises
        return f"There is no sample topology {sample!r} ({exc})."
    try:
        a, b = (_as_gpu(g) for g in (() if isinstance(pair, str) else pair))
        if a is None or b is None:
            raise ValueError("each must be a whole number")
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
    fig = expected_figure(mine.code, gen)
    low, high = fig.low_GBps, fig.high_GBps
    slips = []
    if fig.kind.startswith("measured"):
        slips.append((high, f"that is a clean PCIe {gen}.0 link; across sockets the article measured {low:g} GB/s "
                            "on this machine."))
        slips.append((low / 2, "that halves the measured figure; with N = 2 the ring factor 2(N-1)/N is 1 and "
                               "busbw equals the article's figure."))
        slips.append((2 * low, "that adds both directions; busbw is per direction, as the link table's figures are."))
        def unmatched(value):
            if value > low:
                return (f"Not yet ({value:g} GB/s): more than was measured on this very path ({low:g} GB/s, the "
                        "source article's busbw); a measurement beats any estimate from the specification.")
            return f"Not yet ({value:g} GB/s): too pessimistic; look up the path in the link table ({low:g} GB/s)."
        reply = grade(busbw_GBps, low, slips, "GB/s", "", right_text="The source article's measured busbw on this "
                      "very path.", fallback=unmatched)
        if reply.startswith("Right: "):
            return f"{text} And the busbw is right: {reply[len('Right: '):]}"
        return f"{text} But the busbw: {reply}"
    value, hint = read_number(busbw_GBps, "GB/s", allow_zero=False)
    if value is None:
        return f"{text} But the busbw: {hint}"
    if low - window(low) <= value <= high + window(high):
        return text + f" And {value:g} GB/s is right: expect {low:g}-{high:g} GB/s, {fig.name}."
    expect = f"{low:g}-{high:g} GB/s, {fig.name}"
    bands = [((o.low_GBps, o.high_GBps), f"that is the PCIe {other}.0 figure ({o.low_GBps:g}-{o.high_GBps:g} GB/s); "
                                         f"this machine's GPUs use PCIe {gen}.0.")
             for other in (3, 4, 5) if other != gen and not mine.code.startswith("NV")
             for o in [expected_figure(mine.code, other)]]
    bands.append(((2 * low, 2 * high), "that adds both directions; busbw is per direction, as the link table's "
                                       "figures are."))
    bands.append(((8 * low, 8 * high), "that is gigabits (Gb/s); GB/s counts bytes, 8 bits each."))
    for (lo, hi), slip in bands:
        if lo * 0.97 <= value <= hi * 1.03:
            return text + f" But {value:g} GB/s: {slip} Expect {expect}."
    if value > high:
        return (text + f" But {value:g} GB/s is above what this path carries ({expect}); busbw cannot beat "
                "the wire.")
    return (text + f" But {value:g} GB/s is too pessimistic: look up the path in the link table; expect "
            f"{expect}.")


def _planted_truth(case: str) -> dict:
    """The planted GPU of a doctor case, its nearest neighbour, and the pair's band now and at full speed.

    The band now is the doctor's for the pair: `path_band` of their path at the lower PCIe
    generation and width of the two (the planted GPU's: its neighbour runs at full speed)."""

    inputs = case_inputs(case)
    topo, facts = inputs["topo"], inputs["facts"]
    planted = next(f for f in facts.gpus if (f.pcie_gen or 0) < (f.pcie_gen_max or 0)
                   or (f.pcie_width or 0) < (f.pcie_width_max or 0))
    gpu = planted.index
    partner = max((j for j in range(len(topo.gpus)) if j != gpu), key=lambda j: (classify(topo.link(gpu, j))[0], -j))
    pair = (planted, facts.gpus[partner])
    code = topo.link(gpu, partner)
    now = path_band(code, min(f.pcie_gen for f in pair), min(f.pcie_width for f in pair))
    full = path_band(code, planted.pcie_gen_max, planted.pcie_width_max)
    return {"gpu": gpu, "partner": partner, "high": now.high_GBps, "low": now.low_GBps,
            "full": full.high_GBps, "planted": planted, "facts": facts}


def _as_gpu(value) -> int | None:
    """A GPU index as typed: 5, np.int64(5), 5.0, "5", "5.0" or "GPU5" are 5; anything else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip().upper().removeprefix("GPU").strip()
        try:
            value = float(text)
        except ValueError:
            return None
    try:
        whole = isinstance(value, (int, float, np.integer, np.floating)) and float(value).is_integer()
    except OverflowError:  # an int past float's range: no GPU has that index
        return None
    return int(value) if whole else None


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
