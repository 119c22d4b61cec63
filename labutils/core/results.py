"""Result files: atomic writes, never overwriting, with metadata; key figures for the instructor.

Layout: every measurement is a pair `<dir>/<kind>-<host>-<UTC stamp>[-n].csv` + `.json`, where the
JSON holds `{"kind", "created_utc", "meta": {...}, "csv": <file name>}`. The directory is
`data/results/` in the repository, or `$LAB_RESULTS_DIR` when set (tests and CI use that).

A sweep (labutils.measure.sweep) is kept as a result of kind "sweep": `SweepResult`, `save_sweep`,
`load_sweep`, read back here without starting a rank (the doctor reads the newest one).
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import math
import os
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from labutils.core.inputs import check_writable_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"


def _configured_dir() -> tuple[str, Path]:
    """(what names it, the folder): $LAB_RESULTS_DIR when set, else <repo>/data/results."""
    env = os.environ.get("LAB_RESULTS_DIR")
    return ("LAB_RESULTS_DIR", Path(env)) if env else ("the results folder", DATA_DIR / "results")


def check_results_dir() -> Path:
    """The results folder when this process can write in it or make it; else LabInputError naming
    LAB_RESULTS_DIR (a file, /proc/..., a read-only place). Makes nothing: the commands that keep
    results check it before they start (labutils.cli)."""
    name, path = _configured_dir()
    return check_writable_dir(name, path)


def results_dir() -> Path:
    """Where result files live: $LAB_RESULTS_DIR, else <repo>/data/results. Created if missing;
    LabInputError naming LAB_RESULTS_DIR when it is a file or cannot be made."""
    name, path = _configured_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError):
        check_writable_dir(name, path)  # says why in one line
        raise
    return path


def _umask() -> int:
    """This process's umask (read from /proc, else set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` via a temporary file in the same folder and os.replace.

    A reader never sees a half-written file; an interrupted write leaves the old file intact.
    The file gets the mode a plain `open` would give (0666 less the umask), not mkstemp's 0600:
    an instructor collects results from another account.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_umask())
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def reserve_path(directory: Path, stem: str, suffixes: tuple[str, ...]) -> Path:
    """A base path `directory/stem[-n]` (n = 1, 2, ... when taken) for which no file with any of
    `suffixes` exists yet; the caller writes `base + suffix` for each.

    The file of the first suffix is created empty with O_EXCL, so two writers (two notebooks, two
    ranks) never pick the same name and nothing is ever overwritten. Used by `save_result` and by
    the trace files of labutils.measure.timeline.
    """
    for n in range(10_000):
        base = directory / (stem if n == 0 else f"{stem}-{n}")
        if any(base.with_name(base.name + s).exists() for s in suffixes[1:]):
            continue
        try:
            fd = os.open(base.with_name(base.name + suffixes[0]), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        return base
    raise RuntimeError(f"no free result name for {stem} in {directory}")


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def _clean(obj):
    """Make floats JSON-safe: NaN and infinities become None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def to_json(obj) -> str:
    """JSON text with numpy scalars converted and NaN/inf written as null."""
    return json.dumps(_clean(json.loads(json.dumps(obj, default=_json_default, allow_nan=True))),
                      indent=2, sort_keys=False)


def utc_stamp(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.UTC)
    return now.strftime("%Y%m%dT%H%M%SZ")


def save_result(kind: str, frame: pd.DataFrame | None, meta: dict, directory: str | os.PathLike | None = None) -> Path:
    """Save a measurement as `<kind>-<host>-<stamp>.json` (+ `.csv` when `frame` is given).

    Never overwrites: an existing name gets a `-1`, `-2`, ... suffix. Returns the JSON path.
    """
    directory = Path(directory) if directory else results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0] or "host"
    created = _dt.datetime.now(_dt.UTC)
    base = reserve_path(directory, f"{kind}-{host}-{utc_stamp(created)}", (".json", ".csv"))
    record = {"kind": kind, "created_utc": created.isoformat(timespec="microseconds"), "meta": meta, "csv": None}
    if frame is not None:
        buf = io.StringIO()
        frame.to_csv(buf, index=False)
        csv_path = write_atomic(base.with_name(base.name + ".csv"), buf.getvalue())
        record["csv"] = csv_path.name
    return write_atomic(base.with_name(base.name + ".json"), to_json(record) + "\n")


def load_result(path: str | os.PathLike) -> tuple[dict, pd.DataFrame | None]:
    """Read a result written by save_result: (record dict, DataFrame or None)."""
    path = Path(path)
    record = json.loads(path.read_text(encoding="utf-8"))
    frame = pd.read_csv(path.with_name(record["csv"])) if record.get("csv") else None
    return record, frame


def list_results(kind: str | None = None, directory: str | os.PathLike | None = None) -> list[Path]:
    """JSON result files of `kind` (all kinds when None), oldest first by their creation stamp."""
    directory = Path(directory) if directory else results_dir()
    found = []
    for path in directory.glob("*.json"):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and (kind is None or record.get("kind") == kind):
            found.append((record.get("created_utc", ""), path.name, path))
    return [p for _, _, p in sorted(found)]


def latest_result(kind: str, directory: str | os.PathLike | None = None,
                  match: Callable[[dict, pd.DataFrame | None], bool] | None = None
                  ) -> tuple[dict, pd.DataFrame | None] | None:
    """The newest result of `kind` (the newest for which `match(record, frame)` is true, when
    given), or None when there is none yet."""
    for path in reversed(list_results(kind, directory)):
        record, frame = load_result(path)
        if match is None or match(record, frame):
            return record, frame
    return None


def record_figure(key: str, value, unit: str = "", label: str = "") -> None:
    """Record one key figure of the running notebook for the instructor's summary.

    The notebook runner sets $LAB_FIGURES_FILE per notebook; elsewhere this is a no-op, so a
    student's interactive session is unaffected. The file maps key -> {value, unit, label}.
    """
    target = os.environ.get("LAB_FIGURES_FILE")
    if not target:
        return
    path = Path(target)
    figures = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if hasattr(value, "item"):
        value = value.item()
    figures[key] = {"value": value, "unit": unit, "label": label or key}
    write_atomic(path, to_json(figures) + "\n")


# --- a sweep, kept as a result of kind "sweep" ----------------------------------------------------

@dataclass(frozen=True)
class SweepResult:
    """A finished sweep: `frame` (one row per op and size, COLUMNS + SWEEP_EXTRA) and `meta`."""

    frame: pd.DataFrame
    meta: dict = field(default_factory=dict)

    @property
    def wrong(self) -> int:
        return int(self.frame["wrong"].fillna(0).sum()) if len(self.frame) else 0

    @property
    def avg_busbw_GBps(self) -> float:
        """nccl-tests' "Avg bus bandwidth": the plain mean of busbw over the rows."""
        return float(self.frame["busbw_GBps"].mean()) if len(self.frame) else math.nan

    @property
    def peak_busbw_GBps(self) -> float:
        return float(self.frame["busbw_GBps"].max()) if len(self.frame) else math.nan


def save_sweep(result: SweepResult):
    """Save a sweep as a result of kind "sweep" (CSV + JSON metadata, atomic, never overwriting)."""
    return save_result("sweep", result.frame, result.meta)


def load_sweep(op: str = "all_reduce", world_size: int | None = None, backend: str | None = None,
               device: str | None = None) -> SweepResult | None:
    """The newest saved sweep that measured `op` (and matches world size, backend and device
    ("cpu" or "cuda") when given)."""
    for path in reversed(list_results("sweep")):
        record, frame = load_result(path)
        meta = record.get("meta", {})
        if frame is None or op not in set(frame["op"]):
            continue
        wanted = {"world_size": world_size, "backend": backend, "device": device}
        if all(v is None or meta.get(k) == v for k, v in wanted.items()):
            return SweepResult(frame[frame["op"] == op].reset_index(drop=True), meta)
    return None
