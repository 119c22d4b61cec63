"""The time-budget dashboard, driven without a browser: sliders, presets, readout, figure, errors."""

import html
import math
import re

import pytest

from labutils.core.results import save_result
from labutils.model import budget as bm
from labutils.show.budget_plots import budget_dashboard, budget_presets

pytest.importorskip("ipywidgets")


def readout_numbers(html: str) -> dict:
    """The numbers of the readout, as a browser test reads them: [data-key] -> float(data-value)."""
    return {key: float(value) for key, value in
            re.findall(r'class="lab-value" data-key="(\w+)" data-value="([^"]+)"', html)}


@pytest.fixture(scope="module")
def dash():
    return budget_dashboard(presets=budget_presets())


def _assert_readout_is_the_model(dash):
    expected = bm.evaluate(**dash.values())
    shown = readout_numbers(dash.readout.value)
    assert set(shown) == set(bm.RESULT_FIELDS)
    for key, value in shown.items():
        want = getattr(expected, key)
        assert (math.isinf(value) and math.isinf(want)) or value == pytest.approx(want), key
        assert dash.state()[key] == pytest.approx(want) or math.isinf(want)
    assert dash.state()["error"] is None
    assert bm.verdict(expected) in html.unescape(dash.readout.value)


def test_starts_on_the_article_base_case(dash):
    assert dash.values() == pytest.approx({k: float(v) for k, v in bm.BASE_CASE.items()})
    assert readout_numbers(dash.readout.value)["t_two_ms"] == pytest.approx(9.22)
    assert 'class="lab-readout"' in dash.readout.value and "lab-readout" in dash.readout._dom_classes
    assert dash.png().startswith(b"\x89PNG")


def test_bandwidth_slider_updates_readout_and_figure(dash):
    before = dash.png()
    dash.sliders["bandwidth_GBps"].value = 50
    assert readout_numbers(dash.readout.value)["t_two_ms"] == pytest.approx(8.58)
    assert dash.png() != before
    t2 = dash.figure.axes[0].get_lines()[1]  # T2 against C, moved in place
    assert t2.get_ydata()[0] == pytest.approx(0.8 + 0.28)
    _assert_readout_is_the_model(dash)


@pytest.mark.parametrize("key,value", [("eta", 0.6), ("latency_ms", 0.2), ("C_ms", 30.0), ("S_ms", 50.0),
                                       ("Q", 10), ("volume_bytes", 1e8), ("bandwidth_GBps", 0.5),
                                       ("eta", 0.45), ("C_ms", 0.0)])
def test_every_slider_changes_the_readout_to_the_model(dash, key, value):
    before = dash.readout.value
    dash.sliders[key].value = value
    assert dash.values()[key] == pytest.approx(value)
    assert dash.readout.value != before
    _assert_readout_is_the_model(dash)


def test_the_figure_is_one_figure_updated_in_place(dash):
    artists = list(dash.figure.axes[0].get_children())
    dash.sliders["eta"].value = 0.9
    dash.sliders["bandwidth_GBps"].value = 2.0
    assert list(dash.figure.axes[0].get_children()) == artists
    assert len(dash.figure.axes) == 1


def test_never_shows_as_never(dash):
    dash.sliders["eta"].value = 0.5
    assert readout_numbers(dash.readout.value)["break_even_C_ms"] == math.inf
    assert "never" in dash.readout.value and 'data-verdict="loses"' in dash.readout.value
    assert "eta &lt;= 0.5" in dash.readout.value


def test_presets_include_links_and_load_into_the_sliders(dash):
    names = [p.name for p in dash.presets]
    assert names[0].startswith("article base case")
    assert any("NVLink" in n for n in names) and any("PCIe" in n for n in names)
    assert any("InfiniBand" in n or "Ethernet" in n for n in names)
    index = next(i for i, p in enumerate(dash.presets) if "NVLink 4" in p.name)
    dash.preset.value = index
    assert dash.values()["bandwidth_GBps"] == pytest.approx(dash.presets[index].values["bandwidth_GBps"])
    assert dash.values()["eta"] == pytest.approx(0.8)
    assert "NVLink 4" in dash.readout.value and "datasheet" in dash.readout.value
    assert 'data-changed="false"' in dash.readout.value
    _assert_readout_is_the_model(dash)
    dash.sliders["C_ms"].value = 3.0
    assert 'data-changed="true"' in dash.readout.value and "since changed" in dash.readout.value
    for preset in dash.presets:
        assert preset.source and set(preset.values) == set(bm.PARAMETERS)


def test_a_measured_link_becomes_a_preset():
    save_result("link", None, {"name": "my link: gloo/cpu, 2 ranks", "latency_ms": 0.085, "bandwidth_GBps": 1.9,
                               "alpha_us": 85.0, "busbw_GBps": 1.9, "world_size": 2, "backend": "gloo",
                               "device": "cpu", "source": "measured on testhost today"})
    save_result("link", None, {"name": "broken"})  # lacks the numbers: skipped, not fatal
    presets = budget_presets()
    mine = [p for p in presets if p.name == "my link: gloo/cpu, 2 ranks"]
    assert len(mine) == 1 and mine[0].source == "measured on testhost today"
    assert not any(p.name == "broken" for p in presets)
    dash = budget_dashboard(presets)
    dash.preset.value = presets.index(mine[0])
    assert dash.values()["latency_ms"] == pytest.approx(0.085)
    assert dash.values()["bandwidth_GBps"] == pytest.approx(1.9)
    _assert_readout_is_the_model(dash)


def test_a_preset_outside_the_slider_range_widens_it():
    base = budget_presets()[0]
    far = type(base)("far", {**base.values, "bandwidth_GBps": 5000.0, "latency_ms": 3.5}, "test")
    dash = budget_dashboard([base, far])
    dash.preset.value = 1
    assert dash.values()["bandwidth_GBps"] == pytest.approx(5000.0)
    assert dash.values()["latency_ms"] == pytest.approx(3.5)
    _assert_readout_is_the_model(dash)


def test_a_callback_error_shows_in_the_readout():
    dash = budget_dashboard()
    dash.sliders["eta"].min = 0.0
    dash.sliders["eta"].value = 0.0  # outside (0, 1]: the model refuses it
    assert "lab-error" in dash.readout.value
    assert "eta=0.0 is outside the allowed range (0, 1]" in dash.readout.value
    assert "LabInputError" in dash.state()["error"]
    dash.sliders["eta"].value = 0.8  # and recovers
    assert "lab-error" not in dash.readout.value and dash.state()["error"] is None


def test_initial_values_and_sliders_are_described():
    dash = budget_dashboard(initial={**bm.BASE_CASE, "C_ms": 1.0})
    assert readout_numbers(dash.readout.value)["t_two_ms"] == pytest.approx(2.345)
    assert dash.preset.value is None  # no preset has these values
    assert budget_dashboard(initial=dict(bm.BASE_CASE)).preset.value == 0  # the base case is preset 0
    descriptions = {k: s.description for k, s in dash.sliders.items()}
    assert descriptions["bandwidth_GBps"] == "bandwidth B (GB/s)" and "η" in descriptions["eta"]
    assert dash.sliders["bandwidth_GBps"].min == -1 and dash.sliders["bandwidth_GBps"].max == 3  # 0.1..1000
    assert all(f"lab-slider-{k.replace('_', '-')}" in s._dom_classes for k, s in dash.sliders.items())


def test_N_and_wire_dtype_toggles_follow_the_n_device_model():
    dash = budget_dashboard()
    assert dash.settings() == {"N": 2, "wire_dtype": "fp32"}
    assert 'data-n="2"' in dash.readout.value and 'data-wire-dtype="fp32"' in dash.readout.value
    before = dash.png()
    dash.controls["N"].value = 4
    expected = bm.evaluate(**dash.values(), n_devices=4)
    shown = readout_numbers(dash.readout.value)
    for key in bm.RESULT_FIELDS:
        assert shown[key] == pytest.approx(getattr(expected, key)) or math.isinf(getattr(expected, key)), key
    assert "4 devices T4" in dash.readout.value and "4-device efficiency" in dash.readout.value
    assert 'data-n="4"' in dash.readout.value and dash.state()["settings"]["N"] == 4
    t2 = dash.figure.axes[0].get_lines()[1]
    assert "4 devices" in t2.get_label()
    assert [t.get_text() for t in dash.figure.axes[0].get_legend().get_texts()][1].startswith("4 devices")
    curve = bm.evaluate(**{**dash.values(), "C_ms": t2.get_xdata()}, n_devices=4)
    assert list(t2.get_ydata()) == pytest.approx(list(curve.t_two_ms))
    assert dash.png() != before
    dash.controls["wire_dtype"].value = "bf16"
    assert readout_numbers(dash.readout.value)["comm_ms"] == pytest.approx(
        bm.evaluate(**dash.values(), n_devices=4, wire_dtype="bf16").comm_ms)
    assert 'data-wire-dtype="bf16"' in dash.readout.value
    dash.controls["N"].value = 2
    dash.controls["wire_dtype"].value = "fp32"
    assert "two devices: T2" in dash.figure.axes[0].get_lines()[1].get_label()
    _assert_readout_is_the_model(dash)  # back to the article's model, exactly


def test_presets_leave_N_and_the_wire_dtype_alone():
    dash = budget_dashboard(N=8, wire_dtype="bf16")
    dash.preset.value = 1
    assert dash.settings() == {"N": 8, "wire_dtype": "bf16"}
    assert readout_numbers(dash.readout.value)["t_two_ms"] == pytest.approx(
        bm.evaluate(**dash.values(), n_devices=8, wire_dtype="bf16").t_two_ms)
    with pytest.raises(bm.LabInputError, match="N="):
        budget_dashboard(N=3)
