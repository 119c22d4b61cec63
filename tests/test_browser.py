"""JupyterLab in a real browser: widgets render, and the time-budget dashboard follows its sliders.

A JupyterLab server (127.0.0.1, token on, temporary settings) serves a temporary copy of the
notebooks; headless Debian chromium, driven by Playwright, runs them as a student would. The
numbers the dashboard shows are checked against `labutils.model.budget.evaluate`, and the figure the
browser shows against the kernel's figure and its curves. A screenshot of the dashboard lands in
out/browser_05_time_budget.png. Skips, saying why, where chromium, Playwright or JupyterLab is
missing or chromium does not start.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import numpy as np
import pytest
from browser_helpers import (
    cell_errors,
    chromium,
    image_sha256,
    jupyter_lab,
    kernel_eval,
    open_notebook,
    press_on_handle,
    readout_text,
    run_all_cells,
    slider,
    type_into_readout,
    why_no_browser,
)

from labutils.model.budget import BASE_CASE, RESULT_FIELDS, evaluate

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "out"
WIDGET_FAILURES = ("Loading widget", "Error displaying widget", "IntSlider(")

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def lab(tmp_path_factory, results_tmp):
    """JupyterLab on a temporary copy of notebooks/ plus one tiny widget notebook; always stopped.

    Its kernels write results into the session's temporary results directory, never data/results.
    """
    reason = why_no_browser()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("lab")
    root = base / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    _write_slider_notebook(root / "slider_probe.ipynb")
    env = {"LAB_RESULTS_DIR": str(results_tmp), "LAB_FIGURES_FILE": None}
    with jupyter_lab(root, base / "jupyter", env) as server:
        yield server
    assert server.process.poll() is not None, "the JupyterLab server is still running"


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as context:
        yield context


@pytest.fixture
def page(browser):
    page = browser.new_page()
    try:
        yield page
    finally:
        page.close()


def _write_slider_notebook(path: Path) -> None:
    """One IntSlider whose kernel-side value is mirrored into an HTML widget."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(
        "import ipywidgets as w\n"
        "knob = w.IntSlider(value=3, min=0, max=10, description='knob')\n"
        "echo = w.HTML('<b class=\"echo\">3</b>')\n"
        "knob.observe(lambda change: setattr(echo, 'value', f'<b class=\"echo\">{change.new}</b>'),\n"
        "             'value')\n"
        "w.VBox([knob, echo])")]
    nbformat.write(nb, path)


def _screenshot(page, name: str) -> Path:
    OUT_DIR.mkdir(exist_ok=True)
    path = OUT_DIR / f"browser_{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_a_slider_renders_and_reaches_the_kernel(lab, page):
    open_notebook(page, lab, "slider_probe.ipynb")
    run_all_cells(page)
    handle = slider(page, "knob").locator(".noUi-handle")
    handle.wait_for(state="visible")
    outputs = " ".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    assert not any(text in outputs for text in WIDGET_FAILURES), f"the widget did not render: {outputs!r}"
    assert readout_text(slider(page, "knob")) == "3"
    press_on_handle(slider(page, "knob"), "ArrowRight", times=2)
    page.locator(".echo", has_text="5").wait_for()  # the kernel saw the move and answered
    assert readout_text(slider(page, "knob")) == "5"
    assert not cell_errors(page)


# --- the time-budget dashboard of notebook 08 ---

BUDGET_NOTEBOOK = "08_time_budget.ipynb"
READOUT = "div.lab-dashboard div.lab-readout[data-verdict]"
FIGURE = "img.lab-figure"
INPUT_ATTRS = {f"data-{key.replace('_', '-').lower()}": key for key in BASE_CASE}
# What the kernel's dashboard plots, read through a second client on the same kernel: the
# figure's PNG (to match what the browser shows), the T2 curve and the markers at the current C.
PLOT_STATE = (
    "(lambda d: {'sha256': __import__('hashlib').sha256(d.png()).hexdigest(),"
    " 't2_x': [float(x) for x in d._art['t2'].get_xdata()],"
    " 't2_y': [float(y) for y in d._art['t2'].get_ydata()],"
    " 'now_y': [float(y) for y in d._art['now_dots'].get_ydata()],"
    " 'even_x': float(d._art['even_line'].get_xdata()[0])})"
    "(next(v for v in list(globals().values()) if type(v).__name__ == 'BudgetDashboard'))")


def _readout(page) -> tuple[dict, dict]:
    """The inputs and the figures the readout shows, from its data attributes."""
    return page.evaluate(
        """([selector, attrs]) => {
            const box = document.querySelector(selector);
            const inputs = Object.fromEntries(Object.entries(attrs).map(
                ([attr, key]) => [key, parseFloat(box.getAttribute(attr))]));
            const shown = Object.fromEntries([...box.querySelectorAll('[data-key][data-value]')].map(
                td => [td.dataset.key, parseFloat(td.dataset.value.replace('inf', 'Infinity'))]));
            return [inputs, shown];
        }""", [READOUT, INPUT_ATTRS])


def _wait_for_inputs(page, **expected) -> None:
    """Wait until the readout reports these inputs (the kernel recomputed after the move)."""
    checks = " && ".join(f"Math.abs(parseFloat(box.getAttribute('{attr}')) / {expected[key]!r} - 1) < 1e-9"
                         for attr, key in INPUT_ATTRS.items() if key in expected)
    page.wait_for_function(f"() => {{ const box = document.querySelector('{READOUT}'); "
                           f"return box && {checks}; }}")


def _assert_dashboard_shows_model(page, lab, expected_inputs: dict) -> str:
    """Readout figures == evaluate(inputs); the browser's image == the kernel's figure, whose
    curves and markers sit at the model's values. Returns the image's sha256."""
    inputs, shown = _readout(page)
    assert inputs == pytest.approx(expected_inputs, rel=1e-9)
    model = evaluate(**inputs)
    for key in RESULT_FIELDS:
        assert shown[key] == pytest.approx(getattr(model, key), rel=1e-9), key
    plot = kernel_eval(lab, BUDGET_NOTEBOOK, PLOT_STATE)
    assert image_sha256(page, FIGURE) == plot["sha256"], "the browser does not show the kernel's figure"
    curve = evaluate(**{**inputs, "C_ms": np.array(plot["t2_x"])})
    assert plot["t2_y"] == pytest.approx(curve.t_two_ms.tolist(), rel=1e-9)
    assert plot["now_y"] == pytest.approx([model.t_one_ms, model.t_two_ms], rel=1e-9)
    if model.break_even_C_ms < plot["t2_x"][-1]:
        assert plot["even_x"] == pytest.approx(model.break_even_C_ms, rel=1e-9)
    return plot["sha256"]


@pytest.fixture(scope="module")
def budget_page(lab, browser):
    """Notebook 08 opened and run once; yields (page, the readout's inputs right after rendering)."""
    page = browser.new_page()
    try:
        open_notebook(page, lab, BUDGET_NOTEBOOK)
        run_all_cells(page)
        assert not cell_errors(page), cell_errors(page)
        page.locator(".lab-dashboard").scroll_into_view_if_needed()
        for key in BASE_CASE:  # every slider rendered (a handle, not "Loading widget...")
            page.locator(f".lab-slider-{key.replace('_', '-')} .noUi-handle").wait_for(state="visible")
        page.locator(READOUT).wait_for()
        yield page, _readout(page)[0]
    finally:
        _screenshot(page, "08_time_budget")
        page.close()


def test_rendering_the_dashboard_keeps_the_notebooks_inputs(budget_page):
    """Drawing the sliders in a browser must not move them: the readout still holds the
    parameters cell's values (the article's base case)."""
    _, inputs = budget_page
    assert inputs == pytest.approx(BASE_CASE, rel=1e-9), (
        "a slider changed its value when the browser drew it (a log slider snaps to its step grid)")


def test_time_budget_dashboard_follows_its_sliders(lab, budget_page):
    """Move the bandwidth (typed into its readout) and η (arrow keys on the handle): after each
    move the readout holds evaluate() of the new inputs and the browser shows a new figure whose
    curve and markers sit at the model's values."""
    page, start = budget_page[0], _readout(budget_page[0])[0]
    bandwidth, eta = page.locator(".lab-slider-bandwidth-GBps"), page.locator(".lab-slider-eta")
    first = _assert_dashboard_shows_model(page, lab, start)

    type_into_readout(page, bandwidth, 50)  # 10 -> 50 GB/s, exactly: not snapped to the log grid
    moved = {**start, "bandwidth_GBps": 50.0}
    _wait_for_inputs(page, bandwidth_GBps=50.0)
    assert float(readout_text(bandwidth)) == 50.0
    second = _assert_dashboard_shows_model(page, lab, moved)

    press_on_handle(eta, "ArrowLeft", times=10)  # 0.80 -> 0.70 in steps of 0.01
    _wait_for_inputs(page, eta=0.70)
    assert readout_text(eta) == "0.70"
    third = _assert_dashboard_shows_model(page, lab, {**moved, "eta": 0.70})
    assert len({first, second, third}) == 3, "the figure did not change with the sliders"


def test_a_preset_sets_every_slider(lab, budget_page):
    """Choosing a link in the preset menu moves all seven sliders to its values, exactly."""
    from labutils.show.budget_plots import budget_presets

    page, _ = budget_page
    menu = page.locator(".lab-preset-menu select")
    chosen = menu.evaluate("select => select.value")  # the option's name (its text has no-break spaces)
    current = _readout(page)[0]
    preset = next(p for p in budget_presets() if p.name != chosen and p.values != current)
    menu.select_option(label=preset.name)
    _wait_for_inputs(page, **preset.values)
    page.locator(f'.lab-preset[data-name="{preset.name}"]').wait_for()
    _assert_dashboard_shows_model(page, lab, preset.values)
