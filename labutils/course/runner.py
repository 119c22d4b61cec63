"""The instructor's run: execute notebooks headlessly with papermill, render HTML, write an index.

`python -m labutils run-notebooks [--quick] [--only 02,06] [--param key=value ...] [--out out/]`
runs the chosen notebooks in order. A failing notebook is reported with its cell and error, or
with the stage that failed after it ran (reading it back, rendering HTML, saving plots, recording
figures), and the others still run; the exit status is 1 when any failed. Each notebook may
record key figures with `labutils.core.results.record_figure`; they are collected into
`out/summary.json` and shown on `out/index.html` with the notebook's plots. Both files are
written whatever happens, also when the run itself stops (Ctrl-C, an unexpected error): the
notebooks it did not reach are listed as not run.
"""

from __future__ import annotations

import ast
import base64
import html
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import papermill as pm
from nbconvert import HTMLExporter
from tqdm.auto import tqdm

from labutils.core.inputs import LabInputError, check_writable_dir
from labutils.core.results import REPO_ROOT, check_results_dir, to_json, write_atomic
from labutils.measure.placement import check_local_ranks

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
MAX_PLOTS_PER_NOTEBOOK = 4


@dataclass(frozen=True)
class NotebookOutcome:
    """What one headless execution produced.

    `failed_cell` counts the cells of the committed notebook from 1 (as a reader counts them; the
    cell papermill injects for parameters is not counted); `failed_source` is that cell's first line.
    `failed_stage` is "" when ok, else the first stage that failed, a key of `STAGES`.
    """

    name: str
    ok: bool
    seconds: float
    out_path: Path
    html_path: Path
    failed_cell: int | None = None
    failed_source: str = ""
    error: str = ""
    figures: dict = field(default_factory=dict)
    plots: tuple[str, ...] = ()
    failed_stage: str = ""

    @property
    def failure(self) -> str:
        """Where and how it failed, in words ("" when ok)."""
        if self.ok:
            return ""
        if self.failed_stage == "execute" and self.failed_cell is not None:
            return f"failed in cell {self.failed_cell} ({self.failed_source!r}): {self.error}"
        return f"failed while {STAGES.get(self.failed_stage, self.failed_stage)}: {self.error}"


STAGES = {"execute": "executing", "read": "reading the executed notebook back", "html": "rendering HTML",
          "plots": "saving plots", "figures": "recording figures", "stopped": "running (stopped part-way)",
          "not run": "waiting its turn (not run)"}


def find_notebooks(only: str | None = None, directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """Notebooks in `directory`, in file-name order; `only="02,08"` keeps those whose name starts so.

    LabInputError for a folder without notebooks, an `only` that names none ('' or ',') or a
    prefix that matches no notebook.
    """
    paths = sorted(Path(directory).glob("*.ipynb"))
    if not paths:
        raise LabInputError(f"--notebooks {str(directory)!r} holds no .ipynb notebook")
    if only is None:
        return paths
    wanted = [w.strip() for w in str(only).split(",") if w.strip()]
    if not wanted:
        raise LabInputError(f"--only {only!r} names no notebook; give prefixes such as 02,08 "
                            f"(have: {', '.join(p.stem for p in paths)})")
    chosen = [p for p in paths if any(p.stem.startswith(w) for w in wanted)]
    unknown = [w for w in wanted if not any(p.stem.startswith(w) for p in paths)]
    if unknown:
        raise LabInputError(f"--only names no notebook: {', '.join(unknown)} "
                            f"(have: {', '.join(p.stem for p in paths)})")
    return chosen


def notebook_parameters(path: Path) -> dict:
    """The literals of a notebook's `parameters` cell: {name: default}; {} when it has none
    (a name whose value is not a literal maps to None, accepting anything)."""
    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.metadata.get("tags", []):
            found = {}
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    try:
                        found[node.targets[0].id] = ast.literal_eval(node.value)
                    except ValueError:
                        found[node.targets[0].id] = None
            return found
    return {}


def _fits(value, default) -> bool:
    """Whether `value` may replace a parameter whose default is `default` (None takes anything)."""
    if default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def check_params(params: dict, paths: list[Path]) -> None:
    """LabInputError unless every parameter is in some chosen notebook's parameters cell, with a
    value of its default's type; `nproc` is bounded by what this machine holds."""
    cells = {p.stem: notebook_parameters(p) for p in paths}
    for name, value in params.items():
        having = {stem: cell[name] for stem, cell in cells.items() if name in cell}
        if not having:
            known = sorted({n for cell in cells.values() for n in cell})
            raise LabInputError(f"--param {name}={value!r}: no chosen notebook has a parameter {name!r} "
                                f"(have: {', '.join(known) or 'none'})")
        for stem, default in having.items():
            if not _fits(value, default):
                raise LabInputError(f"--param {name}={value!r} does not fit {stem}'s {name} = {default!r} "
                                    f"(a {type(default).__name__})")
        if name == "nproc" and value is not None:
            check_local_ranks(value, name="--param nproc")


def check_out_dir(out_dir, directory: Path = NOTEBOOK_DIR) -> Path:
    """The output folder, or LabInputError naming --out for '', a file, a place that cannot be made
    or written (/proc/..., a read-only disk), or the notebooks' folder. Makes nothing."""
    path = check_writable_dir("--out", out_dir)
    if path.resolve() == Path(directory).resolve():
        raise LabInputError(f"--out {str(out_dir)} is the notebooks' folder: the executed copies would replace them")
    return path


def parse_params(pairs: list[str] | None) -> dict:
    """`["n=4", "label=x"]` -> {"n": 4, "label": "x"}; values are Python literals when they parse."""
    params = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise LabInputError(f"--param {pair!r} must look like name=value")
        try:
            params[key.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            params[key.strip()] = raw
    return params


def _save_plots(nb, out_dir: Path, stem: str, problems: list) -> tuple[str, ...]:
    """The notebook's first PNG outputs as files under out/figures/; an image that does not decode
    is skipped and noted in `problems` as stage "plots" with its cell, counted as `_locate_error` does."""
    saved = []
    own = [c for c in nb.cells if not _ADDED_TAGS & set(c.metadata.get("tags", []))]
    for number, cell in enumerate(own, start=1):
        for output in cell.get("outputs", []):
            data = output.get("data", {}) if isinstance(output, dict) else {}
            if "image/png" in data and len(saved) < MAX_PLOTS_PER_NOTEBOOK:
                path = out_dir / "figures" / f"{stem}-{len(saved) + 1}.png"
                try:
                    png = base64.b64decode(data["image/png"])
                    if not png.startswith(b"\x89PNG"):
                        raise ValueError("the image/png output is not a PNG image")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(png)
                except (ValueError, TypeError, OSError) as exc:
                    problems.append(("plots", f"cell {number}: {type(exc).__name__}: {exc}"))
                    continue
                saved.append(str(path.relative_to(out_dir)))
    return tuple(saved)


_ADDED_TAGS = {"injected-parameters", "papermill-error-cell-tag"}


def _locate_error(nb) -> tuple[int | None, str]:
    """The failing cell, counted from 1 among the committed notebook's cells, and its first line."""
    own = [c for c in nb.cells if not _ADDED_TAGS & set(c.metadata.get("tags", []))]
    for number, cell in enumerate(own, start=1):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return number, (cell.source.strip().splitlines() or [""])[0][:120]
    return None, ""


def _render_html(nb, html_path: Path) -> None:
    body, _ = HTMLExporter().from_notebook_node(nb)
    write_atomic(html_path, body)


def _read_figures(path: Path) -> dict:
    """The figures a notebook recorded: {key: {"value", "unit", "label"}}; ValueError when mangled."""
    if not path.exists():
        return {}
    figures = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(figures, dict) or not all(isinstance(v, dict) for v in figures.values()):
        raise ValueError(f"{path.name} is not a mapping of key -> {{value, unit, label}}")
    return figures


def _stage(problems: list, name: str, fn):
    """Run one stage; on an error note (stage, error) in `problems` and return None."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - one stage's failure must not stop the others
        problems.append((name, f"{type(exc).__name__}: {exc}"))
        return None


def execute_notebook(path: Path, out_dir: Path, parameters: dict | None = None,
                     results_dir: Path | None = None, timeout_s: int = 1800) -> NotebookOutcome:
    """Execute one notebook with papermill into `out_dir` (.ipynb + .html), never raising for its
    errors: a failure while executing, reading back, rendering HTML, saving plots or recording
    figures is reported in the outcome (`failed_stage`), and the stages after it still run."""
    path, out_dir = Path(path).resolve(), Path(out_dir).resolve()  # the kernel runs in the notebook's folder
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path, html_path = out_dir / path.name, out_dir / f"{path.stem}.html"
    figures_file = out_dir / f".{path.stem}.figures.json"
    for stale in (figures_file, out_path, html_path):  # never show an earlier run's files as this one's
        if stale.exists() and stale != path:
            stale.unlink()
    env_before = dict(os.environ)
    os.environ["LAB_FIGURES_FILE"] = str(figures_file)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    if results_dir is not None or os.environ.get("LAB_RESULTS_DIR"):
        os.environ["LAB_RESULTS_DIR"] = str(Path(results_dir or os.environ["LAB_RESULTS_DIR"]).resolve())
    started = time.monotonic()
    problems: list[tuple[str, str]] = []
    try:
        pm.execute_notebook(str(path), str(out_path), parameters=parameters or {}, kernel_name="python3",
                            cwd=str(path.parent), progress_bar=False, execution_timeout=timeout_s)
    except pm.PapermillExecutionError as exc:
        problems.append(("execute", f"{exc.ename}: {exc.evalue}"))
    except Exception as exc:  # noqa: BLE001 - kernel death, timeout: report, do not stop the run
        problems.append(("execute", f"{type(exc).__name__}: {exc}"))
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    seconds = time.monotonic() - started
    failed_cell, failed_source, plots = None, "", ()
    nb = _stage(problems, "read", lambda: nbformat.read(out_path, as_version=4)) if out_path.exists() else None
    if nb is not None:
        if problems and problems[0][0] == "execute":
            failed_cell, failed_source = _stage(problems, "read", lambda: _locate_error(nb)) or (None, "")
        _stage(problems, "html", lambda: _render_html(nb, html_path))
        plots = _stage(problems, "plots", lambda: _save_plots(nb, out_dir, path.stem, problems)) or ()
    figures = _stage(problems, "figures", lambda: _read_figures(figures_file)) or {}
    stage, error = problems[0] if problems else ("", "")
    if len(problems) > 1:
        error += "; then " + "; ".join(f"{STAGES[s]}: {e}" for s, e in problems[1:])
    return NotebookOutcome(path.stem, not problems, seconds, out_path, html_path, failed_cell, failed_source, error,
                           figures, plots, stage)


def _figure_text(fig) -> str:
    if not isinstance(fig, dict):
        return html.escape(str(fig))
    value = fig.get("value")
    if isinstance(value, float):
        value = f"{value:.4g}"
    return (f"{html.escape(str(fig.get('label', '')))}: <b>{html.escape(str(value))}</b> "
            f"{html.escape(fig.get('unit', ''))}")


def write_index(outcomes: list[NotebookOutcome], out_dir: Path, quick: bool, stopped: str | None = None) -> Path:
    """One page: each notebook's status, time, key figures and plots, linked to its HTML."""
    rows = []
    for o in outcomes:
        if o.ok:
            status = "ok"
        elif o.failed_stage == "execute" and o.failed_cell is not None:
            status = (f"FAILED in cell {o.failed_cell} <code>{html.escape(o.failed_source)}</code>: "
                      f"{html.escape(o.error[:300])}")
        else:
            status = (f"FAILED while {html.escape(STAGES.get(o.failed_stage, o.failed_stage))}: "
                      f"{html.escape(o.error[:300])}")
        figs = "<br>".join(_figure_text(f) for f in o.figures.values()) or "&mdash;"
        imgs = "".join(f'<a href="{p}"><img src="{p}" alt="plot of {o.name}"></a>' for p in o.plots)
        page_link = f'<a href="{o.html_path.name}">{o.name}</a>' if o.html_path.exists() else o.name
        nb_link = f' (<a href="{o.out_path.name}">ipynb</a>)' if o.out_path.exists() else ""
        rows.append(f'<tr class="{"ok" if o.ok else "fail"}"><td>{page_link}{nb_link}</td><td>{status}</td>'
                    f"<td>{o.seconds:.1f} s</td><td>{figs}</td><td class=plots>{imgs}</td></tr>")
    mode = "quick mode" if quick else "full mode"
    halted = f" <b>The run stopped early: {html.escape(stopped)}.</b>" if stopped else ""
    when = time.strftime("%Y-%m-%d %H:%M")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Interconnect Lab results</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #999;
padding:6px;vertical-align:top}}tr.fail{{background:#fdd}}tr.ok td:nth-child(2){{color:#060}}
.plots img{{height:120px;margin:2px}}</style></head><body>
<h1>Interconnect Lab: executed notebooks</h1>
<p>{len(outcomes)} notebook(s), {sum(o.ok for o in outcomes)} succeeded, {mode}, {when}.{halted}</p>
<table><tr><th>notebook</th><th>status</th><th>time</th><th>key figures</th><th>plots</th></tr>
{''.join(rows)}</table></body></html>
"""
    return write_atomic(out_dir / "index.html", page)


def write_summary(outcomes: list[NotebookOutcome], out_dir: Path, quick: bool, stopped: str | None = None) -> Path:
    """out/summary.json: per notebook ok, seconds, where it failed, its figures, units and plots;
    `stopped` says why the run ended early (None when it ran to the end)."""
    def values(o, key, default):
        return {k: (v.get(key, default) if isinstance(v, dict) else v) for k, v in o.figures.items()}

    summary = {"quick": quick, "stopped": stopped, "notebooks": {
        o.name: {"ok": o.ok, "seconds": round(o.seconds, 2), "failed_stage": o.failed_stage,
                 "failed_cell": o.failed_cell, "failed_source": o.failed_source, "error": o.error,
                 "html": o.html_path.name if o.html_path.exists() else None,
                 "figures": values(o, "value", None), "units": values(o, "unit", ""), "plots": list(o.plots)}
        for o in outcomes}}
    return write_atomic(out_dir / "summary.json", to_json(summary) + "\n")


def _not_run(path: Path, out_dir: Path, why: str, running_s: float | None = None) -> NotebookOutcome:
    """A notebook the run never finished: cut short while it ran (`running_s` seconds in), or not reached."""
    if running_s is not None:
        return NotebookOutcome(path.stem, False, running_s, out_dir / path.name, out_dir / f"{path.stem}.html",
                               error=f"stopped while it ran, {running_s:.0f} s in ({why})", failed_stage="stopped")
    return NotebookOutcome(path.stem, False, 0.0, out_dir / path.name, out_dir / f"{path.stem}.html",
                           error=f"the run stopped before it ({why})", failed_stage="not run")


def run_notebooks(only: str | None = None, quick: bool = False, params: dict | None = None,
                  out_dir: str | Path = "out", results_dir: Path | None = None,
                  directory: Path = NOTEBOOK_DIR) -> list[NotebookOutcome]:
    """Execute the chosen notebooks in order with a progress bar; write index.html and summary.json.

    Both files are written also when the run stops early (an exception, Ctrl-C: it is raised
    again afterwards), listing the notebooks not reached as not run.
    """
    paths = find_notebooks(only, directory)
    out_dir = check_out_dir(out_dir, directory)
    check_params(params or {}, paths)
    if results_dir is not None:
        check_writable_dir("results_dir", results_dir)
    elif os.environ.get("LAB_RESULTS_DIR"):
        check_results_dir()
    parameters = {**({"quick": True} if quick else {}), **(params or {})}
    outcomes: list[NotebookOutcome] = []
    stopped, current, started = None, None, 0.0
    try:
        bar = tqdm(paths, desc="notebooks", unit="nb", file=sys.stderr)
        for path in bar:
            bar.set_postfix_str(path.stem)
            current, started = path, time.monotonic()
            outcome = execute_notebook(path, out_dir, parameters, results_dir)
            outcomes.append(outcome)
            if not outcome.ok:
                tqdm.write(f"FAILED {path.name}: {outcome.failure}", file=sys.stderr)
    except BaseException as exc:
        stopped = f"{type(exc).__name__}: {exc}".rstrip(": ")
        raise
    finally:
        done = {o.name for o in outcomes}
        running_s = time.monotonic() - started
        listed = outcomes + [_not_run(p, out_dir, stopped or "unknown", running_s if p == current else None)
                             for p in paths if p.stem not in done]
        write_summary(listed, out_dir, quick, stopped)
        write_index(listed, out_dir, quick, stopped)
    return outcomes


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the run (a CI job's time limit, `timeout`, `kill`); handled as Ctrl-C is,
    so no notebook's error handling mistakes it for a failing cell."""


def _terminated(signum, frame):
    raise Terminated(f"signal {signum}, terminated")


def _cli(args) -> int:
    directory = Path(args.notebooks)
    if not directory.is_dir():
        raise LabInputError(f"--notebooks {directory} is not a folder")
    # SIGTERM stops the run like Ctrl-C: the notebook under way is cut short (its kernel shut
    # down) and index.html and summary.json still list what ran and what did not.
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        outcomes = run_notebooks(args.only, args.quick, parse_params(args.param), args.out, directory=directory)
    except Terminated:
        print(f"stopped by SIGTERM; {Path(args.out) / 'summary.json'} lists what ran", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    ok = sum(o.ok for o in outcomes)
    total = sum(o.seconds for o in outcomes)
    print(f"{ok}/{len(outcomes)} notebooks succeeded in {total:.0f} s; open {Path(args.out) / 'index.html'}")
    for o in outcomes:
        if not o.ok:
            print(f"  {o.name}: {o.failure}")
    return 0 if ok == len(outcomes) else 1


def add_cli(sub) -> None:
    p = sub.add_parser("run-notebooks", help="execute notebooks headlessly into out/ with an index page")
    p.add_argument("--quick", action="store_true", help="quick mode (what CI runs)")
    p.add_argument("--only", help="comma-separated notebook prefixes, e.g. 02,08")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="papermill parameter (repeatable)")
    p.add_argument("--out", default="out", help="output folder (default: out)")
    p.add_argument("--notebooks", default=str(NOTEBOOK_DIR), help="folder of notebooks (default: the lab's)")
    p.set_defaults(func=_cli)
