"""Reference figures for each kind of link, from `data/link_table.csv`.

Every row says where its figures come from and what each end of its range is: `low_kind` names the
low end (`LOW_KINDS`: a specification, per direction, decimal GB/s; an all-reduce bus bandwidth
measured by the source article; one commonly reported; the article's quoted clean-link figure; the
lab's estimate; or derived), and `kind` the whole range: the low end's kind alone when both ends are
of one kind, else "<low kind> to <high kind>" (e.g. "reported busbw to specification"). `path_class`
groups rows by the kind of path: PCIe (a GPU's own link), PIX, PXB, PHB, NODE and SYS (the codes
of `nvidia-smi topo -m` between two GPUs), HOST (two GPUs without peer access: through host
memory), NV (NVLink), NET (network), gloo (CPU-staged). Rows stated for PCIe 5.0 x16 are carried
over to other generations and widths by `pcie.scale_to_pcie`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from labutils.core.inputs import check_choice, check_int
from labutils.core.results import DATA_DIR

LINK_TABLE = DATA_DIR / "link_table.csv"

# what the low end of a row can be; the high end is a specification or the same kind as the low end
LOW_KINDS = ("specification", "measured busbw", "reported busbw", "quoted clean link", "estimate", "derived")


def range_kind(low_kind: str, high_kind: str) -> str:
    """The `kind` of a range whose ends are `low_kind` and `high_kind`: one word when they agree."""
    return low_kind if low_kind == high_kind else f"{low_kind} to {high_kind}"


@lru_cache(maxsize=1)
def _table() -> pd.DataFrame:
    return pd.read_csv(LINK_TABLE)


def load_link_table() -> pd.DataFrame:
    """The table as a DataFrame: name, path_class, low_GBps, high_GBps, kind, low_kind, source, nvlinks."""
    return _table().copy()


@dataclass(frozen=True)
class LinkFigure:
    """One row of the table. `typical_GBps` is the middle of [low, high]; `kind` says what the range
    is, `low_kind` what its low end is (empty: the same as `kind`)."""

    name: str
    path_class: str
    low_GBps: float
    high_GBps: float
    kind: str
    source: str
    low_kind: str = ""

    def __post_init__(self):
        if not self.low_kind:
            object.__setattr__(self, "low_kind", self.kind.split(" to ")[0])

    @property
    def typical_GBps(self) -> float:
        return (self.low_GBps + self.high_GBps) / 2


def link_figures(path_class: str | None = None) -> list[LinkFigure]:
    """Rows of the table as LinkFigure, optionally only one `path_class`."""
    rows = _table() if path_class is None else _table()[_table().path_class == path_class]
    keys = ("name", "path_class", "low_GBps", "high_GBps", "kind", "source", "low_kind")
    return [LinkFigure(**{k: r[k] for k in keys}) for r in rows.to_dict("records")]


def link_figure(name: str) -> LinkFigure:
    """The row called `name`; KeyError lists the names when there is none."""
    for fig in link_figures():
        if fig.name == name:
            return fig
    raise KeyError(f"no link called {name!r}; known: {', '.join(f.name for f in link_figures())}")


def pcie_figure(gen: int) -> LinkFigure:
    """The PCIe x16 row of generation `gen` (3, 4 or 5). Any generation and width: `pcie.pcie_band`."""

    check_choice("pcie_gen", gen, (3, 4, 5))
    return link_figure(f"PCIe {gen}.0 x16")


def nvlink_figure(links: int) -> LinkFigure:
    """Per-direction figure for a bonded set of `links` NVLinks (the `NV#` of nvidia-smi topo -m).

    A row whose `nvlinks` column equals `links` (e.g. 18 = H100 SXM) is used as it is; any other
    count is `links` times the per-link rows: low = links x the slowest per-link low, high =
    links x the fastest per-link high, because topo -m does not say which NVLink generation it is.
    """

    links = check_int("links", links, low=1)
    table = _table()
    counts = pd.to_numeric(table.get("nvlinks"), errors="coerce")
    exact = table[(counts == links) & (counts > 1)]
    if len(exact):
        return link_figure(exact.iloc[0]["name"])
    per_link = [f for f in link_figures("NV") if f.name.startswith("NVLink per link")]
    slowest = min(per_link, key=lambda f: f.low_GBps)
    fastest = max(per_link, key=lambda f: f.high_GBps)
    return LinkFigure(
        name=f"NVLink x{links}",
        path_class="NV",
        low_GBps=links * slowest.low_GBps,
        high_GBps=links * fastest.high_GBps,
        kind=range_kind(slowest.low_kind, fastest.kind.split(" to ")[-1]),
        source=f"{links} x the per-link rows: " + "; ".join(f.name for f in per_link),
        low_kind=slowest.low_kind,
    )
