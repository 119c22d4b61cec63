"""Predicting all-reduce time: the latency + bandwidth (alpha-beta) model, fitted to a sweep.

    time_us(size_bytes, N) = alpha_us + 2(N-1)/N * size_bytes / (busbw_GBps * 1e3)

`alpha_us` is the fixed cost of one all-reduce (launch, handshakes, one trip round the ring);
the second term is the article's T = 2(N-1)/N * bytes / busbw, with busbw in decimal GB/s
(1 GB/s = 1e3 bytes per microsecond). The fit weighs every size by its relative error, so the
microsecond-scale small messages count as much as the millisecond-scale large ones.

Two honest checks of a fit (`heldout_table`, `heldout_sentence`): fitted on every other size it
predicts the sizes between (interpolation); fitted without the largest sizes it predicts them
(extrapolation), which is what a prediction past the sweep's largest size, such as the article's
200 MB on a sweep that stops at 64 MiB, depends on.

A pure model (notebook 05): no launcher, no files. A fitted link is saved and read back by
labutils.measure.my_link; the sweep that measures it is labutils.measure.sweep.
"""

from __future__ import annotations

import datetime as _dt
import math
import socket
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from labutils.core.busbw import bus_factor, format_size
from labutils.core.inputs import (
    LabInputError,
    as_float_array,
    check_broadcast,
    check_choice,
    check_range,
    check_whole,
    float_or_array,
)

# The source article's example: a 200 MB gradient (decimal MB) on a link with busbw ~22 GB/s.
ARTICLE_GRADIENT_BYTES = 200e6
ARTICLE_BUSBW_GBps = 22.0
# More ranks than any job runs (the largest run about 10**5); 2(N-1)/N stays exact below it.
MAX_WORLD_SIZE = 10**9


@dataclass(frozen=True)
class LinkFit:
    """A measured link: fixed cost `alpha_us` per all-reduce and asymptotic `busbw_GBps`.

    Fit quality: `n_points` sizes used; `heldout_median_error` and `heldout_max_error` are
    relative errors |predicted - measured| / measured on sizes left out of a second fit
    (NaN when there were too few sizes to hold any out). `source` says where it came from.
    """

    alpha_us: float
    busbw_GBps: float
    world_size: int
    backend: str
    device: str
    n_points: int = 0
    heldout_median_error: float = math.nan
    heldout_max_error: float = math.nan
    source: str = ""

    @property
    def latency_ms(self) -> float:
        """The fixed cost in milliseconds (what the time-budget model calls the latency)."""
        return self.alpha_us / 1e3

    def budget_params(self) -> dict:
        """The link in the time budget's names (labutils.model.budget): latency_ms = alpha_us / 1e3 and
        bandwidth_GBps = busbw_GBps. The one translation; presets, notebooks 09 and 10 use it."""
        return {"latency_ms": self.latency_ms, "bandwidth_GBps": self.busbw_GBps}

    @property
    def name(self) -> str:
        return f"my link: {self.backend}/{self.device}, {self.world_size} ranks"


def allreduce_ms(size_bytes, world_size, busbw_GBps, alpha_us=0.0, buckets=1):
    """All-reduce time of `size_bytes` sent in `buckets` pieces (one all-reduce each), in ms:

        time_ms = buckets · alpha_us / 1e3 + 2(N−1)/N · size_bytes / (busbw_GBps · 1e6)

    nccl-tests' AllReduceGetBw read backwards (busbw = algbw · 2(N−1)/N, algbw = bytes / time):
    the article's T = 2(N−1)/N · bytes / busbw, plus the fixed cost of each all-reduce. 200e6 bytes
    at 22 GB/s take 9.1 ms on N = 2, 15.9 ms on N = 8. N = 1 sends nothing (0 ms), nor do 0 bytes; a
    busbw of 0 answers math.inf ("never"). The one all-reduce time of the lab: the fit's
    predictions, the data-parallel step (labutils.model.ddp_model) and the dashboards all call it.
    Works on numpy arrays; LabInputError for a negative size, bandwidth or alpha, N < 1, or a
    bucket count that is not a whole number >= 1.
    """
    _check_allreduce(size_bytes, world_size, busbw_GBps, alpha_us, buckets)
    size, n, busbw, alpha, k = map(as_float_array, (size_bytes, world_size, busbw_GBps, alpha_us, buckets))
    with np.errstate(divide="ignore", invalid="ignore"):
        wire_ms = bus_factor("all_reduce", n) * size / (busbw * 1e6)
    time_ms = k * alpha / 1e3 + np.where(size > 0, wire_ms, 0.0)  # no bytes take no time, even at busbw 0
    return float_or_array(np.where(n > 1, time_ms, 0.0))  # one rank exchanges nothing


def _check_allreduce(size_bytes, world_size, busbw_GBps, alpha_us, buckets) -> None:
    """The door of `allreduce_ms`: each input in its range, whole buckets, shapes that broadcast."""
    check_range("size_bytes", size_bytes, low=0, unit="bytes")
    check_range("busbw_GBps", busbw_GBps, low=0, unit="GB/s")
    check_whole("world_size", world_size, low=1, high=MAX_WORLD_SIZE, unit="ranks")
    check_range("alpha_us", alpha_us, low=0, high=np.inf, high_open=True, unit="us")
    check_range("buckets", buckets, low=1, high=np.inf, high_open=True, unit="all-reduces")
    if not np.all(np.mod(as_float_array(buckets), 1) == 0):
        raise LabInputError(f"buckets={buckets!r} must be a whole number of all-reduces")
    check_broadcast(size_bytes=size_bytes, world_size=world_size, busbw_GBps=busbw_GBps, alpha_us=alpha_us,
                    buckets=buckets)


def latency_term_us(world_size, alpha_step_us: float, algorithm: str = "ring"):
    """Latency part of an all-reduce built from point-to-point steps of cost `alpha_step_us`.

    ring: 2(N-1) steps (N-1 reduce-scatter + N-1 all-gather) -> 2(N-1) * alpha_step_us;
    tree: up the tree and down again, 2 * ceil(log2 N) steps -> 2 * ceil(log2 N) * alpha_step_us.
    The ring grows linearly with N, the tree logarithmically: why NCCL prefers trees at scale
    for small messages.
    """
    check_whole("world_size", world_size, low=1, high=MAX_WORLD_SIZE, unit="ranks")
    check_range("alpha_step_us", alpha_step_us, low=0, high=np.inf, high_open=True, unit="us")
    check_choice("algorithm", algorithm, ("ring", "tree"))
    check_broadcast(world_size=world_size, alpha_step_us=alpha_step_us)
    n = np.asarray(world_size, dtype=float)
    steps = 2.0 * (n - 1.0) if algorithm == "ring" else 2.0 * np.ceil(np.log2(n))
    out = steps * alpha_step_us
    return float(out) if np.ndim(out) == 0 else out


def article_table(busbw_GBps: float = ARTICLE_BUSBW_GBps, size_bytes: float = ARTICLE_GRADIENT_BYTES,
                  world_sizes=(2, 4, 8)) -> pd.DataFrame:
    """The article's example as a table: N, factor 2(N-1)/N, bandwidth-only all-reduce time (ms)."""
    check_whole("world_sizes", world_sizes, low=1, high=MAX_WORLD_SIZE, unit="ranks")
    if np.ndim(world_sizes) != 1:
        raise LabInputError(f"world_sizes={world_sizes!r} must be a list of whole numbers of ranks, e.g. (2, 4, 8)")
    check_range("busbw_GBps", busbw_GBps, low=0, low_open=True, unit="GB/s")
    check_range("size_bytes", size_bytes, low=0, high=np.inf, high_open=True, unit="bytes")
    if np.ndim(busbw_GBps) or np.ndim(size_bytes):
        raise LabInputError("article_table takes one busbw_GBps and one size_bytes (a row per world size)")
    n = np.asarray(world_sizes, dtype=float)
    return pd.DataFrame({"world_size": np.asarray(world_sizes, dtype=int),
                         "factor": bus_factor("all_reduce", n),
                         "time_ms": allreduce_ms(size_bytes, n, busbw_GBps)})


# --- fitting ---------------------------------------------------------------------------------

def _bus_bytes(frame: pd.DataFrame) -> np.ndarray:
    """Bytes each rank effectively moves: size_bytes * bus factor of the row's collective."""
    ops = frame["op"] if "op" in frame else pd.Series(["all_reduce"] * len(frame), index=frame.index)
    factors = [bus_factor(op, int(n)) for op, n in zip(ops, frame["world_size"])]
    return frame["size_bytes"].to_numpy(dtype=float) * np.asarray(factors)


def _solve(x_bytes: np.ndarray, t_us: np.ndarray) -> tuple[float, float]:
    """Least squares of t = a + b x in relative error; a >= 0, b >= 0.

    With w = 1/t (per us) it minimises sum((a w + b x w - 1)^2), the squared relative errors.
    When the best a is negative the optimum with a >= 0 lies on a = 0, where
    d/db sum((b x w - 1)^2) = 0 gives b = sum(x w) / sum((x w)^2); when time does not grow with
    size, b = 0 and a = sum(w) / sum(w^2). Returns (alpha_us, us_per_bus_byte).
    """
    w = 1.0 / t_us
    design = np.column_stack([w, x_bytes * w])
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(t_us), rcond=None)
    if a < 0:  # the fixed cost is too small to see: fit the bandwidth alone
        a, b = 0.0, float(np.sum(x_bytes * w) / np.sum((x_bytes * w) ** 2))
    if b <= 1e-9 * a / max(float(np.max(x_bytes)), 1.0):  # time does not grow with size: latency only
        a, b = float(np.sum(w) / np.sum(w * w)), 0.0
    return float(a), float(b)


def _as_frame(frame) -> pd.DataFrame:
    """A sweep frame: a DataFrame, or the list of row dicts a student builds by hand; else LabInputError."""
    if isinstance(frame, pd.DataFrame):
        return frame
    if isinstance(frame, (list, tuple)) and frame and all(isinstance(row, dict) for row in frame):
        return pd.DataFrame(list(frame))
    raise LabInputError(f"frame={frame!r:.60} is not a sweep: give a pandas DataFrame (or a list of row dicts) "
                        "with columns size_bytes, world_size and the time, one row per size")


MIN_TIME_US = 1e-3  # a nanosecond: no collective is that fast (a kernel launch alone takes microseconds)


def _check_numbers(frame: pd.DataFrame, columns) -> pd.DataFrame:
    """The frame with each of `columns` as floats; LabInputError naming the column, row and value
    for text (a number given as text is a slip, not a number), booleans, None, an infinity, a
    negative value or NaN in a size or world size, and a time (the last column) above 0 but below
    MIN_TIME_US (a denormal such as 2.2e-313 would also break the least squares). NaN and 0 times
    stay: nothing was measured there."""
    out = {}
    for name in columns:
        values = frame[name]
        for row, value in values.items():
            real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
            try:
                number = float(value) if real else math.nan
            except OverflowError:
                number = math.inf
            if not real or math.isinf(number) or number < 0 or (math.isnan(number) and name != columns[-1]):
                what = "not a number" if not real else "not a measurement"
                raise LabInputError(f"{name}={value!r:.40} (row {row}) is {what}: the sweep's {name} must hold "
                                    f"finite numbers >= 0, one per row")
            if name == columns[-1] and 0 < number < MIN_TIME_US:
                raise LabInputError(f"{name}={value!r:.40} (row {row}) is below {MIN_TIME_US:g} us: no collective "
                                    "is that fast; give the time in us (0 or NaN for a size not measured)")
        out[name] = values.astype(float)
    return frame.assign(**out)


def _clean_frame(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows a fit uses: positive time and size, no wrong elements, the out-of-place half of an
    nccl-tests log; LabInputError for a frame that is not a sweep (text, infinities, a fractional
    size or world size, no single world size >= 2, fewer than 2 sizes)."""
    frame = _as_frame(frame)
    if not isinstance(column, str):
        raise LabInputError(f"column={column!r} must name a column of the frame, such as 'time_us'")
    needed = {"size_bytes", "world_size", column}
    missing = needed - set(frame.columns)
    if missing:
        raise LabInputError(f"the sweep frame lacks column(s) {sorted(missing)}; have {list(frame.columns)}")
    frame = _check_numbers(frame, ("size_bytes", "world_size", column))
    rows = frame[(frame[column] > 0) & (frame["size_bytes"] > 0)]
    for name, unit in (("size_bytes", "bytes"), ("world_size", "ranks")):
        fractional = rows.loc[np.mod(rows[name].astype(float), 1) != 0, name]
        if len(fractional):
            raise LabInputError(f"{name}={float(fractional.iloc[0])!r} (row {fractional.index[0]}) is not a whole "
                                f"number of {unit}")
    if "wrong" in rows:
        rows = rows[~(rows["wrong"].fillna(0) > 0)]  # a wrong result is not a measurement
    if "in_place" in rows and rows["in_place"].nunique() > 1:
        rows = rows[~rows["in_place"].astype(bool)]  # nccl-tests logs: keep the out-of-place half
    if len(rows) < 2:
        raise LabInputError(f"fitting needs at least 2 sizes with a positive {column}; got {len(rows)}")
    worlds = rows["world_size"].unique()
    if len(worlds) != 1 or not 2 <= worlds[0] <= MAX_WORLD_SIZE:
        raise LabInputError(f"fitting needs one world size >= 2 in the frame; got {sorted(worlds)}")
    return rows.sort_values("size_bytes")


def _check_distinct(rows: pd.DataFrame) -> None:
    """LabInputError when one size (of one op) appears twice: repetitions of one measurement, not
    two points of the line. A fit takes one time per size (and its hold-out split would otherwise
    test a size against its own twin); the message names the size and how to keep one."""
    keys = ["op", "size_bytes"] if "op" in rows else ["size_bytes"]
    counts = rows.groupby(keys).size()
    repeated = counts[counts > 1]
    if len(repeated):
        key, times = repeated.index[0], int(repeated.iloc[0])
        size = key[-1] if isinstance(key, tuple) else key
        op = f" of {key[0]}" if isinstance(key, tuple) else ""
        raise LabInputError(f"size_bytes={int(size)}{op} appears {times} times ({len(repeated)} size(s) repeated): "
                            "repetitions of one size, not points of the line; keep one time per size, e.g. their "
                            f"median: frame.groupby({keys!r}, as_index=False).median(numeric_only=True)")


def _to_fit(a: float, b: float, n_points: int, world: int, backend: str, device: str, source: str) -> LinkFit:
    busbw = math.inf if b == 0 else 1.0 / (b * 1e3)
    return LinkFit(a, busbw, world, backend, device, n_points, source=source)


def split_alternate(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, held-out): sizes sorted, every other one held out, both ends kept for training.
    The held-out sizes lie between fitted ones: this checks interpolation."""
    rows = frame.sort_values("size_bytes").reset_index(drop=True)
    held = [i for i in range(1, len(rows) - 1, 2)]
    return rows.drop(index=held), rows.loc[held]


LARGEST_HELD = 2  # sizes held out above the fit: on a power-of-two sweep, up to 4x past the fit's largest


def split_largest(frame: pd.DataFrame, count: int = LARGEST_HELD) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, held-out): sizes sorted, the `count` largest held out (fewer when fewer than
    count + 2 sizes, so that two remain to fit). The held-out sizes lie past every fitted one:
    this checks extrapolation, what a prediction beyond the sweep's largest size relies on."""
    rows = frame.sort_values("size_bytes").reset_index(drop=True)
    held = list(range(max(2, len(rows) - count), len(rows)))
    return rows.drop(index=held), rows.loc[held]


HELD_SPLITS = {"alternate": split_alternate, "largest": split_largest}


def relative_errors(frame: pd.DataFrame, fit: LinkFit, column: str = "time_us") -> pd.DataFrame:
    """size_bytes, measured_us, predicted_us, rel_error = |predicted - measured| / measured."""
    measured = frame[column].to_numpy(dtype=float)
    bus = _bus_bytes(frame)
    predicted = fit.alpha_us + (0.0 if math.isinf(fit.busbw_GBps) else bus / (fit.busbw_GBps * 1e3))
    return pd.DataFrame({"size_bytes": frame["size_bytes"].to_numpy(), "measured_us": measured,
                         "predicted_us": predicted, "rel_error": np.abs(predicted - measured) / measured})


def crossover_bytes(fit: LinkFit, op: str = "all_reduce") -> float:
    """Message size where the bandwidth term equals alpha: alpha_us * busbw * 1e3 / factor bytes.

    Below it the collective is latency-bound (time ~ alpha), above it bandwidth-bound.
    """
    if not isinstance(fit, LinkFit):
        raise LabInputError(f"fit={fit!r:.60} is not a LinkFit: give the result of fit_alpha_beta or load_link")
    factor = bus_factor(op, fit.world_size)
    if factor == 0 or math.isinf(fit.busbw_GBps):
        return math.inf
    return fit.alpha_us * fit.busbw_GBps * 1e3 / factor


def fit_alpha_beta(frame: pd.DataFrame, column: str = "time_us", holdout: bool = True,
                   source: str | None = None) -> LinkFit:
    """Fit time = alpha_us + bus_bytes / (busbw_GBps * 1e3) to a sweep, minimising relative error.

    bus_bytes = size_bytes * bus factor (2(N-1)/N for all_reduce), so any collective's sweep fits
    the same link. Rows with wrong elements are dropped. With `holdout` (and at least 4 sizes),
    a second fit on every other size predicts the sizes it did not see; their median and max
    relative error are the fit's quality. The returned alpha and busbw use every size.
    """
    rows = _clean_frame(frame, column)
    _check_distinct(rows)
    world = int(rows["world_size"].iloc[0])
    backend = str(rows["backend"].iloc[0]) if "backend" in rows else "unknown"
    device = str(rows["device"].iloc[0]) if "device" in rows else ("cuda" if backend == "nccl" else "cpu")
    device = "cuda" if device.startswith("cuda") else device
    source = source or f"measured on {socket.gethostname().split('.')[0]} {_dt.date.today().isoformat()}"
    a, b = _solve(_bus_bytes(rows), rows[column].to_numpy(dtype=float))
    fit = _to_fit(a, b, len(rows), world, backend, device, source)
    if holdout and len(rows) >= 4:
        train, held = split_alternate(rows)
        part = _to_fit(*_solve(_bus_bytes(train), train[column].to_numpy(dtype=float)),
                       len(train), world, backend, device, source)
        errors = relative_errors(held, part, column)["rel_error"]
        fit = replace(fit, heldout_median_error=float(errors.median()), heldout_max_error=float(errors.max()))
    return fit


def heldout_table(frame: pd.DataFrame, column: str = "time_us",
                  held: str = "alternate") -> tuple[LinkFit, pd.DataFrame]:
    """A fit on part of the sizes and its predictions for all sizes, with a `held_out` flag.

    held="alternate": every other size held out (`split_alternate`, interpolation);
    held="largest": the largest sizes held out (`split_largest`, extrapolation)."""
    check_choice("held", held, tuple(HELD_SPLITS))
    rows = _clean_frame(frame, column)
    _check_distinct(rows)
    train, out = HELD_SPLITS[held](rows)
    part = fit_alpha_beta(train, column, holdout=False)
    table = relative_errors(rows, part, column)
    table["held_out"] = table["size_bytes"].isin(out["size_bytes"])
    return part, table


def heldout_errors(table: pd.DataFrame) -> tuple[float, float]:
    """(median, max) relative error over the held-out rows of a `heldout_table`; NaN when none."""
    errors = table.loc[table["held_out"], "rel_error"]
    return (float(errors.median()), float(errors.max())) if len(errors) else (math.nan, math.nan)


def _than(a: float, b: float, rel_tol: float = 0.1) -> str:
    """a against b: "about the same as" within `rel_tol` (10 %), else "3.2 times" / "0.4 times"."""
    return "about the same as" if abs(a / b - 1) <= rel_tol else f"{a / b:.2g} times"


def heldout_sentence(inside: pd.DataFrame, beyond: pd.DataFrame, predict_bytes: float) -> str:
    """Both held-out checks and which one a prediction at `predict_bytes` depends on, from the numbers.

    `inside` and `beyond` are `heldout_table(frame)` and `heldout_table(frame, held="largest")`.
    A size inside the measured range is an interpolation; past the largest measured size an
    extrapolation, and when it reaches further past the sweep than the check's held-out sizes
    past their fit, the sentence says the check understates it; below the smallest, the check
    (which extrapolates upwards) does not cover it."""
    check_range("predict_bytes", predict_bytes, low=0, low_open=True, high=np.inf, high_open=True, unit="bytes")
    if np.ndim(predict_bytes):
        raise LabInputError(f"predict_bytes={predict_bytes!r} must be one size in bytes")
    (i_med, i_max), (b_med, b_max) = heldout_errors(inside), heldout_errors(beyond)
    if math.isnan(i_med) or math.isnan(b_med):
        return "Too few sizes to hold any out: measure more sizes to check the fit."
    fitted_top = float(beyond.loc[~beyond["held_out"], "size_bytes"].max())
    held = beyond.loc[beyond["held_out"], "size_bytes"]
    low, top = float(inside["size_bytes"].min()), float(inside["size_bytes"].max())
    reach = float(held.max()) / fitted_top
    text = (f"Interpolation (every other size left out of the fit): median error {i_med:.1%}, worst {i_max:.1%}. "
            f"Extrapolation (a fit up to {format_size(fitted_top)} predicting "
            f"{' and '.join(format_size(s) for s in held)}, up to {reach:.2g}x past it): median error {b_med:.1%}, "
            f"worst {b_max:.1%}, {_than(b_med, i_med) if i_med > 0 else 'against none for'} the interpolation's. ")
    where = f"{predict_bytes / 1e6:g} MB"
    if predict_bytes > top * (1 + EDGE_SLACK):
        past = predict_bytes / top
        text += (f"{where} is {past:.2g}x the largest measured size ({format_size(top)}): its prediction is an "
                 f"extrapolation, so the extrapolation error ({b_med:.1%}) is the one to expect")
        return text + (f", or more: it reaches further past the sweep than the check did ({reach:.2g}x)."
                       if past > reach * (1 + EDGE_SLACK) else ".")
    if predict_bytes < low / (1 + EDGE_SLACK):
        return text + (f"{where} is below the smallest measured size ({format_size(low)}): neither check covers "
                       "it (the time there is about alpha).")
    return text + (f"{where} lies inside the measured range ({format_size(low)} to {format_size(top)}): its "
                   f"prediction interpolates, so the interpolation error ({i_med:.1%}) is the one to expect.")


# --- the measured curve, interpolated -------------------------------------------------------------

EDGE_SLACK = 0.01  # sizes this close past the measured ends count as measured


@dataclass(frozen=True)
class CurvePrediction:
    """All-reduce times read off a measured sweep. `time_us` per requested size; `extrapolated`
    marks sizes outside [min_bytes, max_bytes], the range the sweep measured."""

    size_bytes: np.ndarray
    time_us: np.ndarray
    extrapolated: np.ndarray
    min_bytes: int
    max_bytes: int

    @property
    def any_extrapolated(self) -> bool:
        return bool(np.any(self.extrapolated))

    def note(self) -> str:
        """One sentence on what lies outside the measured range (empty when nothing does)."""
        if not self.any_extrapolated:
            return ""
        sizes = ", ".join(format_size(int(s)) for s in self.size_bytes[self.extrapolated])
        return (f"{sizes} lie outside the measured {format_size(self.min_bytes)}-{format_size(self.max_bytes)}: "
                "above it the time grows in proportion to the bytes at the largest size's bandwidth, below it "
                "the time is the smallest size's (extrapolated, not measured)")


def interpolate_time_us(frame: pd.DataFrame, size_bytes, column: str = "time_us") -> CurvePrediction:
    """All-reduce time for `size_bytes` read off the measured sweep `frame`, in microseconds.

    Inside the measured range: straight lines between neighbouring sizes on log-log axes,
    log t = log t_i + (log s - log s_i) (log t_j - log t_i) / (log s_j - log s_i), so a curve whose
    bandwidth falls once messages leave the cache is followed where one alpha-beta line is not.
    Outside it (flagged in `extrapolated`): above the largest size s_max, t = t_max * s / s_max (the
    largest size's bandwidth, which a falling curve does not regain); below the smallest, t = t_min
    (a fixed cost does not shrink). Sizes within EDGE_SLACK (1%) of an end, a model's width
    rounding past a measured power of two, are not flagged. Rows with wrong elements are dropped;
    needs 2 sizes or more.
    """
    rows = _clean_frame(frame, column).groupby("size_bytes", as_index=False)[column].median()
    s = rows["size_bytes"].to_numpy(dtype=float)
    t = rows[column].to_numpy(dtype=float)
    want = np.atleast_1d(np.asarray(size_bytes, dtype=float))
    check_range("size_bytes", want, low=0, low_open=True, unit="bytes")
    inside = np.exp(np.interp(np.log(want), np.log(s), np.log(t)))
    out = np.where(want > s[-1], t[-1] * want / s[-1], np.where(want < s[0], t[0], inside))
    beyond = (want > s[-1] * (1 + EDGE_SLACK)) | (want < s[0] / (1 + EDGE_SLACK))
    return CurvePrediction(want, out, beyond, int(s[0]), int(s[-1]))
