"""The time budget on the command line: `python -m labutils budget` prints the figures of
labutils.model.budget for the article's base case or the inputs given, as a table or JSON.
"""

from __future__ import annotations

import math

from labutils.core.inputs import LabInputError
from labutils.core.results import to_json
from labutils.model.budget import (
    BASE_CASE,
    MAX_DEVICES,
    PARAMETERS,
    RESULT_FIELDS,
    WIRE_DTYPES,
    Budget,
    check_devices,
    check_scalar,
    evaluate,
    verdict,
    wire_dtype_name,
)

_FLAGS = {"S_ms": "--S-ms", "C_ms": "--C-ms", "eta": "--eta", "Q": "--Q", "latency_ms": "--latency-ms",
          "volume_bytes": "--volume-bytes", "bandwidth_GBps": "--bandwidth-GBps"}


_HELP = {"S_ms": "serial time that cannot be split (ms)", "C_ms": "divisible compute on one device (ms)",
         "eta": "local efficiency of each half, in (0, 1]", "Q": "serialised communications",
         "latency_ms": "startup cost of each communication (ms)",
         "volume_bytes": "bytes on the critical path of each communication",
         "bandwidth_GBps": "effective bandwidth (decimal GB/s)"}


_LABELS = {"t_one_ms": ("one device, T1", "ms"), "t_two_ms": ("two devices, T2", "ms"),
           "comm_ms": ("communication, H", "ms"), "speedup": ("speedup T1/T2", "x"),
           "efficiency": ("two-device efficiency", ""), "break_even_C_ms": ("break-even C", "ms"),
           "min_bandwidth_GBps": ("minimum bandwidth", "GB/s"), "min_eta": ("minimum eta", ""),
           "ideal_overlap_ms": ("perfect-overlap estimate", "ms")}


def _number(name: str, text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise LabInputError(f"{name}={text!r} is not a number ({_FLAGS[name]})") from None


def _labels(N: int) -> dict:
    if N == 2:
        return _LABELS
    return {**_LABELS, "t_two_ms": (f"{N} devices, T_N", "ms"), "speedup": ("speedup T1/T_N", "x"),
            "efficiency": (f"{N}-device efficiency", "")}


def format_budget_table(params: dict, budget: Budget, wire_dtype: str = "fp32") -> str:
    """The readable report printed by `python -m labutils budget` (N devices and the wire dtype when not 2 / fp32)."""
    check_scalar(budget, "format_budget_table")
    N = budget.n_devices
    shown = ", ".join(f"{name}={params[name]:.10g}" for name in PARAMETERS)
    wire = wire_dtype_name(wire_dtype)
    if N == 2 and wire == "fp32":
        head = "Two-device time budget (a model, not a measurement)"
    else:
        head = (f"Time budget on N = {N} devices, a ring all-reduce per exchange, {wire} on the wire "
                "(a model, not a measurement)")
        shown += f", N={N}, wire_dtype={wire}"
    lines = [head, f"inputs: {shown}", ""]
    for name in RESULT_FIELDS:
        label, unit = _labels(N)[name]
        value = getattr(budget, name)
        text = "never" if math.isinf(value) else f"{value:.6g} {unit}"
        lines.append(f"  {label:<24} {text}".rstrip())
    lines += ["", verdict(budget)]
    lines += [f"note ({k}): {v}" for k, v in budget.notes.items()]
    return "\n".join(lines)


def _devices_arg(text) -> int:
    if text is None:
        return 2
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise LabInputError(f"N={text!r} is not a number (--N)") from None
    try:
        return check_devices(value)
    except LabInputError:
        raise LabInputError(f"N={text!r} is outside the allowed range: a whole number of devices in "
                            f"[2, {MAX_DEVICES:,}] (--N)") from None


def _cli(args) -> int:
    params = {name: _number(name, getattr(args, name)) if getattr(args, name) is not None else BASE_CASE[name]
              for name in PARAMETERS}
    N = _devices_arg(args.N)
    wire = "fp32" if args.wire_dtype is None else args.wire_dtype
    try:
        wire = wire_dtype_name(wire)
    except LabInputError as exc:
        raise LabInputError(f"{exc} (--wire-dtype)") from None
    try:
        budget = evaluate(**params, n_devices=N, wire_dtype=wire)
    except LabInputError as exc:
        name = str(exc).split("=", 1)[0]
        raise LabInputError(f"{exc} ({_FLAGS[name]})" if name in _FLAGS else str(exc)) from None
    print(to_json(budget.as_dict()) if args.json else format_budget_table(params, budget, wire))
    return 0


def add_cli(sub) -> None:
    """`python -m labutils budget [--S-ms ...] [--N 4] [--wire-dtype bf16] [--json]`
    (defaults: the article's base case)."""
    parser = sub.add_parser("budget", help="the time budget: T1, T2 (or T_N), speedup, break-even",
                            description="Evaluate the time budget of splitting work over two (or N) devices. "
                                        "Defaults are the article's base case; a 'never' is printed as never "
                                        "(null in JSON).")
    for name, flag in _FLAGS.items():
        parser.add_argument(flag, dest=name, metavar="X", default=None,
                            help=f"{_HELP[name]} [base case: {BASE_CASE[name]:g}]")
    parser.add_argument("--N", dest="N", metavar="N", default=None,
                        help="devices sharing the work, each exchange a ring all-reduce: H = Q((N-1)l + "
                             "2(N-1)/N V/B) [2: the article's model]")
    parser.add_argument("--wire-dtype", dest="wire_dtype", metavar="D", default=None,
                        help=f"dtype on the wire, one of {', '.join(WIRE_DTYPES)}; V is counted in fp32, "
                             "bf16/fp16 halve it [fp32]")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(func=_cli)
