"""Graders of notebooks 05-08 (tensor parallel, the time budget, validating it, data-parallel
training).
"""

from __future__ import annotations

import numpy as np

from labutils.core.busbw import bus_factor
from labutils.course.grading import grade
from labutils.experiments.tensor_parallel import TOY_A, TOY_B, relu, toy_split, toy_whole, toy_wrong_split
from labutils.model import budget as bm
from labutils.model import hardware_ratio as hr
from labutils.model.ddp_model import max_hidden_gradient_bytes, min_busbw_for_efficiency, predicted_efficiency

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
