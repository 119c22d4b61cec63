"""Graders of notebooks 06 (tensor parallelism: the toy split's contributions) and 07 (the backward
pass: the bytes a split model all-reduces in a step), on the shared reading and judging of
`labutils.course.grading`.
"""

from __future__ import annotations

import numpy as np

from labutils.core.busbw import element_bytes
from labutils.core.inputs import LabInputError
from labutils.course.grading import grade
from labutils.experiments.megatron import tp_allreduce_bytes
from labutils.model.toy_split import TOY_A, TOY_B, relu, toy_input, toy_split, toy_whole, toy_wrong_split


def check_toy_contribution(answer, x=((-1, 2),)) -> str:
    """Notebook 06: device 2's contribution ReLU(x A[:, 2:4]) B[2:4, :] for a new input x.

    Recognises the usual slips (no ReLU, device 1's part, the whole output, the wrong split, B's
    other rows) and answers with a hint rather than right/wrong."""
    try:
        x = toy_input(x)
    except LabInputError as exc:
        return f"This case cannot be graded ({exc})."
    if answer is None:
        return "Replace None with device 2's contribution, two numbers such as [a, b]."
    if isinstance(answer, (str, bytes, dict, set, bool)):
        return f"Give two numbers in a list, e.g. [a, b], not {answer!r}."
    try:
        got = np.asarray(answer, dtype=float).reshape(-1)
    except (TypeError, ValueError, OverflowError):
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


# --- 07 · the all-reduces of a split model ------------------------------------------------------------


def check_step_allreduce_bytes(answer_bytes, layers: int, batch: int, sequence: int, hidden: int,
                               dtype: str = "bfloat16", training: bool = True) -> str:
    """Notebook 07: bytes tensor parallelism all-reduces in one training step (or one inference
    forward pass) of `layers` transformer layers: count x layers x tokens x hidden x bytes, with
    tokens = batch x sequence and count 4 per layer in training, 2 in inference
    (`labutils.experiments.megatron.tp_allreduce_bytes`).

    Slips: the other pass's count (2 for 4, 4 for 2), the MLP block alone, one layer, batch in
    place of batch x sequence, fp32's 4 bytes, bits for bytes (and the unit slips of `grading`)."""
    try:
        tokens = int(batch) * int(sequence)
        right = float(tp_allreduce_bytes(layers, tokens, hidden, dtype, training))
        per = element_bytes(dtype)
    except Exception as exc:  # noqa: BLE001
        return f"This case cannot be graded ({exc})."
    count = 4 if training else 2
    if training:
        per_layer = [(right / 2, "that is 2 all-reduces per layer: the forward pass's g's alone, or one block's g "
                                 "and f. A training step of attention + MLP makes 4: two g's forward, two f's "
                                 "backward.")]
    else:
        per_layer = [(right * 2, "4 per layer is a training step; inference runs forward only, so only the two "
                                 "g's all-reduce: 2 per layer."),
                     (right / 2, "that is 1 all-reduce per layer; attention and the MLP are both split, each "
                                 "with its own g.")]
    slips = per_layer + [
        (right / int(layers), f"that is one layer; the model has {int(layers)}."),
        (right / int(sequence), "that uses the batch alone; every token is a row of the layer, so V = "
                                "batch x sequence x hidden x bytes."),
        (right * 4 / per if per != 4 else None, f"that uses 4 bytes per element (fp32); {dtype} has {per}."),
        (right * 8, "that is 8 times the answer: bits, not bytes.")]
    how = (f"Count {count} all-reduces per layer, each of V = batch x sequence x hidden x {per} bytes, "
           "times the layers.")
    text = (f"{count} x {int(layers)} layers x {tokens} tokens x {int(hidden)} x {per} bytes.")
    return grade(answer_bytes, right, [sl for sl in slips if sl[0] is not None], "bytes", how, rel_tol=0.005,
                 right_text=text)
