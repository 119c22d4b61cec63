"""The instructor's run: execute notebooks headlessly with papermill, render HTML, write an index.

`python -m labutils run-notebooks [--quick] [--only 02,05] [--param key=value ...] [--out out/]`
runs the chosen notebooks in order. A failing notebook is reported with its cell and error and
the others still run; the exit status is 1 when any failed. Each notebook may record key figures
with `labutils.results.record_figure`; they are collected into `out/summary.json` and shown on
`out/index.html` with the notebook's plots.
"""

from __future__ import annotations

import ast
import base64
import html
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from labutils.results import REPO_ROOT, to_json, write_atomic
from labutils.validate import LabInputError

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
MAX_PLOTS_PER_NOTEBOOK = 4


@dataclass(frozen=True)
class NotebookOutcome:
    """What one headless execution produced.

    `failed_cell` counts the cells of the committed notebook from 1 (as a reader counts them; the
    cell papermill injects for parameters is not counted); `failed_source` is that cell's first line.
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


def find_notebooks(only: str | None = None, directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """Notebooks in `directory`, in file-name order; `only="02,05"` keeps those whose name starts so."""
    paths = sorted(directory.glob("*.ipynb"))
    if not only:
        return paths
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    chosen = [p for p in paths if any(p.stem.startswith(w) for w in wanted)]
    unknown = [w for w in wanted if not any(p.stem.startswith(w) for p in paths)]
    if unknown:
        raise LabInputError(f"--only names no notebook: {', '.join(unknown)} "
                            f"(have: {', '.join(p.stem for p in paths)})")
    return chosen


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


def _save_plots(nb, out_dir: Path, stem: str) -> tuple[str, ...]:
    saved = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {}) if isinstance(output, dict) else {}
            if "image/png" in data and len(saved) < MAX_PLOTS_PER_NOTEBOOK:
                path = out_dir / "figures" / f"{stem}-{len(saved) + 1}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(data["image/png"]))
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
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    write_atomic(html_path, body)


def execute_notebook(path: Path, out_dir: Path, parameters: dict | None = None,
                     results_dir: Path | None = None, timeout_s: int = 1800) -> NotebookOutcome:
    """Execute one notebook with papermill into `out_dir` (.ipynb + .html), never raising for its errors."""
    import nbformat
    import papermill as pm

    path, out_dir = Path(path).resolve(), Path(out_dir).resolve()  # the kernel runs in the notebook's folder
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path, html_path = out_dir / path.name, out_dir / f"{path.stem}.html"
    figures_file = out_dir / f".{path.stem}.figures.json"
    if figures_file.exists():
        figures_file.unlink()
    env_before = dict(os.environ)
    os.environ["LAB_FIGURES_FILE"] = str(figures_file)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    if results_dir is not None or os.environ.get("LAB_RESULTS_DIR"):
        os.environ["LAB_RESULTS_DIR"] = str(Path(results_dir or os.environ["LAB_RESULTS_DIR"]).resolve())
    started = time.monotonic()
    failed_cell, error = None, ""  # the cell is located in the executed notebook below
    try:
        pm.execute_notebook(str(path), str(out_path), parameters=parameters or {}, kernel_name="python3",
                            cwd=str(path.parent), progress_bar=False, execution_timeout=timeout_s)
    except pm.PapermillExecutionError as exc:
        error = f"{exc.ename}: {exc.evalue}"
    except Exception as exc:  # noqa: BLE001 - kernel death, timeout: report, do not stop the run
        error = f"{type(exc).__name__}: {exc}"
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    seconds = time.monotonic() - started
    plots: tuple[str, ...] = ()
    failed_source = ""
    if out_path.exists():
        nb = nbformat.read(out_path, as_version=4)
        if error:
            failed_cell, failed_source = _locate_error(nb)
        _render_html(nb, html_path)
        plots = _save_plots(nb, out_dir, path.stem)
    figures = json.loads(figures_file.read_text()) if figures_file.exists() else {}
    return NotebookOutcome(path.stem, not error, seconds, out_path, html_path, failed_cell, failed_source, error,
                           figures, plots)


def _figure_text(fig: dict) -> str:
    value = fig.get("value")
    if isinstance(value, float):
        value = f"{value:.4g}"
    return f"{html.escape(str(fig.get('label', '')))}: <b>{html.escape(str(value))}</b> {html.escape(fig.get('unit', ''))}"


def write_index(outcomes: list[NotebookOutcome], out_dir: Path, quick: bool) -> Path:
    """One page: each notebook's status, time, key figures and plots, linked to its HTML."""
    rows = []
    for o in outcomes:
        status = "ok" if o.ok else (f"FAILED in cell {o.failed_cell} <code>{html.escape(o.failed_source)}</code>: "
                                    f"{html.escape(o.error[:300])}")
        figs = "<br>".join(_figure_text(f) for f in o.figures.values()) or "&mdash;"
        imgs = "".join(f'<a href="{p}"><img src="{p}" alt="plot of {o.name}"></a>' for p in o.plots)
        rows.append(f'<tr class="{"ok" if o.ok else "fail"}"><td><a href="{o.html_path.name}">{o.name}</a>'
                    f' (<a href="{o.out_path.name}">ipynb</a>)</td><td>{status}</td><td>{o.seconds:.1f} s</td>'
                    f"<td>{figs}</td><td class=plots>{imgs}</td></tr>")
    mode = "quick mode" if quick else "full mode"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Interconnect Lab results</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #999;
padding:6px;vertical-align:top}}tr.fail{{background:#fdd}}tr.ok td:nth-child(2){{color:#060}}
.plots img{{height:120px;margin:2px}}</style></head><body>
<h1>Interconnect Lab: executed notebooks</h1>
<p>{len(outcomes)} notebook(s), {sum(o.ok for o in outcomes)} succeeded, {mode}, {time.strftime('%Y-%m-%d %H:%M')}.</p>
<table><tr><th>notebook</th><th>status</th><th>time</th><th>key figures</th><th>plots</th></tr>
{''.join(rows)}</table></body></html>
"""
    return write_atomic(out_dir / "index.html", page)


def write_summary(outcomes: list[NotebookOutcome], out_dir: Path, quick: bool) -> Path:
    summary = {"quick": quick, "notebooks": {
        o.name: {"ok": o.ok, "seconds": round(o.seconds, 2), "failed_cell": o.failed_cell,
                 "failed_source": o.failed_source, "error": o.error,
                 "html": o.html_path.name, "figures": {k: v.get("value") for k, v in o.figures.items()},
                 "units": {k: v.get("unit", "") for k, v in o.figures.items()}, "plots": list(o.plots)}
        for o in outcomes}}
    return write_atomic(out_dir / "summary.json", to_json(summary) + "\n")


def run_notebooks(only: str | None = None, quick: bool = False, params: dict | None = None,
                  out_dir: str | Path = "out", results_dir: Path | None = None,
                  directory: Path = NOTEBOOK_DIR) -> list[NotebookOutcome]:
    """Execute the chosen notebooks in order with a progress bar; write index.html and summary.json."""
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    paths = find_notebooks(only, directory)
    parameters = {**({"quick": True} if quick else {}), **(params or {})}
    outcomes = []
    bar = tqdm(paths, desc="notebooks", unit="nb", file=sys.stderr)
    for path in bar:
        bar.set_postfix_str(path.stem)
        outcome = execute_notebook(path, out_dir, parameters, results_dir)
        outcomes.append(outcome)
        if not outcome.ok:
            tqdm.write(f"FAILED {path.name} in cell {outcome.failed_cell} ({outcome.failed_source!r}): "
                       f"{outcome.error}", file=sys.stderr)
    write_index(outcomes, out_dir, quick)
    write_summary(outcomes, out_dir, quick)
    return outcomes


def _cli(args) -> int:
    directory = Path(args.notebooks)
    if not directory.is_dir():
        raise LabInputError(f"--notebooks {directory} is not a folder")
    outcomes = run_notebooks(args.only, args.quick, parse_params(args.param), args.out, directory=directory)
    ok = sum(o.ok for o in outcomes)
    total = sum(o.seconds for o in outcomes)
    print(f"{ok}/{len(outcomes)} notebooks succeeded in {total:.0f} s; open {Path(args.out) / 'index.html'}")
    for o in outcomes:
        if not o.ok:
            print(f"  {o.name}: failed in cell {o.failed_cell} ({o.failed_source!r}): {o.error}")
    return 0 if ok == len(outcomes) else 1


def add_cli(sub) -> None:
    p = sub.add_parser("run-notebooks", help="execute notebooks headlessly into out/ with an index page")
    p.add_argument("--quick", action="store_true", help="quick mode (what CI runs)")
    p.add_argument("--only", help="comma-separated notebook prefixes, e.g. 02,05")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="papermill parameter (repeatable)")
    p.add_argument("--out", default="out", help="output folder (default: out)")
    p.add_argument("--notebooks", default=str(NOTEBOOK_DIR), help="folder of notebooks (default: the lab's)")
    p.set_defaults(func=_cli)
