"""One pattern for the lab's dashboards (`labutils.show.budget_plots`, `labutils.show.ddp_plots`):
controls -> pure compute -> the readout and the figure updated in place.

A dashboard is a frozen dataclass over its widgets. `refresh`, observed on every control, reads
the controls (`values`), calls `compute`, a pure function of those values taken from the model
modules, then `draw` (moves the figure's artists and returns PNG bytes) and `readout_html` (the
numbers in elements with `data-key` / `data-value` attributes, for tests and browsers to read).
An error anywhere is shown in the readout (class `lab-error`, `error_html`), never swallowed, and
kept as `state()["error"]`. The figure is a plain matplotlib Figure rendered to PNG into an
`ipywidgets.Image`, so it works in a plain JupyterLab (no ipympl) and never flickers.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass

import ipywidgets as w
from IPython.display import HTML, Image, display
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

WIDTH = "430px"  # the controls' and the readout's column
LABEL = {"description_width": "150px"}


def error_html(exc: BaseException) -> str:
    """What the readout shows when a callback fails: the error, in red, with its type."""
    return (f'<div class="lab-readout lab-error" data-error="{html.escape(type(exc).__name__)}" '
            f'style="color:#b00020"><b>Error: {html.escape(type(exc).__name__)}</b>: {html.escape(str(exc))}</div>')


def agg_figure(dpi: int, **adjust):
    """A 9 x 4 inch matplotlib Figure on an Agg canvas (no pyplot, no backend state), margins `adjust`."""
    figure = Figure(figsize=(9.0, 4.0), dpi=dpi)
    FigureCanvasAgg(figure)
    figure.subplots_adjust(**adjust)
    return figure


def figure_png(figure) -> bytes:
    """The whole figure as PNG bytes."""
    buf = io.BytesIO()
    figure.savefig(buf, format="png", bbox_inches=None)
    return buf.getvalue()


def layout(controls: list, image_width: str):
    """The dashboard's widgets: the controls column beside the readout, the figure below.
    Returns (box, readout, image)."""
    readout = w.HTML(layout=w.Layout(width=WIDTH))
    readout.add_class("lab-readout")
    image = w.Image(format="png", layout=w.Layout(width=image_width))
    image.add_class("lab-figure")
    box = w.VBox([w.HBox([w.VBox(controls), readout]), image])
    box.add_class("lab-dashboard")
    return box, readout, image


@dataclass(frozen=True)
class Dashboard:
    """Controls -> `compute` (pure) -> readout + figure in place. Subclasses give `compute`,
    `draw` and `readout_html`; `_state` keeps the last numbers, plus private keys starting with
    "_" (artists, a kept background) that `state()` leaves out. Display it (`dash` as the last line
    of a cell)."""
    sliders: dict
    readout: object
    image: object
    figure: object
    box: object
    _state: dict

    def values(self) -> dict:
        return {key: float(slider.value) for key, slider in self.sliders.items()}

    def compute(self, values: dict) -> dict:
        """The numbers shown, from the model modules (pure)."""
        raise NotImplementedError

    def draw(self, values: dict, numbers: dict) -> bytes:
        """Move the figure's artists to `numbers`; the figure as PNG bytes."""
        raise NotImplementedError

    def readout_html(self, values: dict, numbers: dict) -> str:
        raise NotImplementedError

    def refresh(self, *_change) -> None:
        """Recompute, update the figure in place and the readout; show an error instead of raising."""
        if self._state.get("_muted"):
            return
        try:
            values = self.values()
            numbers = self.compute(values)
            png = self.draw(values, numbers)
            self.readout.value = self.readout_html(values, numbers)
            self.image.value = png
            self._state.update({**numbers, "values": values, "error": None})
        except Exception as exc:  # noqa: BLE001 - shown to the reader, see error_html
            self.readout.value = error_html(exc)
            self._state["error"] = f"{type(exc).__name__}: {exc}"

    def watch(self, widgets) -> None:
        """Refresh on every change of `widgets`' values, and once now."""
        for widget in widgets:
            widget.observe(self.refresh, names="value")
        self.refresh()

    def state(self) -> dict:
        """The numbers shown, "values" and "error" (None when all went well)."""
        return {k: v for k, v in self._state.items() if not k.startswith("_")}

    def png(self) -> bytes:
        return bytes(self.image.value)

    def show_static(self) -> None:
        """Display the current figure and readout as plain outputs (kept in exported HTML)."""
        display(Image(self.png()))
        display(HTML(self.readout.value))

    def _repr_mimebundle_(self, **kwargs):
        return self.box._repr_mimebundle_(**kwargs)
