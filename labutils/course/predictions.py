"""Predictions made before a measurement, judged by how far off they were, never right or wrong
(every notebook asks for one before it measures)."""

from __future__ import annotations

import math

from labutils.course.grading import a_number, read_number, unit_slips


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
