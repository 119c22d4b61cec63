"""My link: the measured alpha-beta link saved as a result of kind "link" and read back; measuring
it when none is saved is `labutils.measure.sweep.ensure_link`. One set of names on disk (LinkFit's
fields: alpha_us, busbw_GBps, world_size, ...); one reader (`link_from_meta`); LinkFit.budget_params
translates it into the time budget's names.

Written by notebooks 02 and 05; read by the budget sliders' presets (labutils.show.budget_plots),
notebook 09 (validation) and notebook 10 (data parallel).
"""

from __future__ import annotations

import datetime as _dt
import math
import socket
from dataclasses import asdict

from labutils.core.inputs import LabInputError
from labutils.core.results import latest_result, list_results, load_result, save_result
from labutils.model.fit import LinkFit

KIND = "link"


def save_link(fit: LinkFit, name: str | None = None):
    """Save `fit` as a result of kind "link" (the "my link" preset); returns the JSON path.

    The metadata holds `name` and LinkFit's fields, nothing else."""
    meta = {"name": name or fit.name, **asdict(fit)}
    meta["source"] = fit.source or f"measured on {socket.gethostname().split('.')[0]} {_dt.date.today()}"
    return save_result(KIND, None, meta)


def link_from_meta(meta: dict) -> LinkFit:
    """The LinkFit of a saved link's metadata; LabInputError when a field LinkFit needs is missing."""
    fields = {k: meta[k] for k in LinkFit.__dataclass_fields__ if k in meta}
    missing = [k for k in ("alpha_us", "busbw_GBps", "world_size", "backend", "device") if k not in fields]
    if missing:
        raise LabInputError(f"a saved link lacks {missing}; save it again with labutils.measure.my_link.save_link")
    for key in ("heldout_median_error", "heldout_max_error"):
        if fields.get(key) is None:
            fields[key] = math.nan
    if fields.get("busbw_GBps") is None:  # infinity is stored as null in JSON
        fields["busbw_GBps"] = math.inf
    return LinkFit(**fields)


def load_link(world_size: int | None = None, backend: str | None = None, device: str | None = None,
              directory=None) -> LinkFit | None:
    """The newest saved link (optionally only one matching world size, backend, device), or None."""
    wanted = {"world_size": world_size, "backend": backend, "device": device}

    def matches(record: dict, _frame) -> bool:
        meta = record.get("meta", {})
        return all(v is None or meta.get(k) == v for k, v in wanted.items())

    found = latest_result(KIND, directory, matches)
    return None if found is None else link_from_meta(found[0].get("meta", {}))


def saved_links(directory=None) -> list[tuple[str, LinkFit, str]]:
    """(name, link, source) of every readable saved link, oldest first; unreadable files are skipped."""
    links = []
    for path in list_results(KIND, directory):
        try:
            meta = load_result(path)[0]["meta"]
            link = link_from_meta(meta)
        except (OSError, ValueError, KeyError, TypeError, LabInputError):
            continue  # a half-written or foreign file is not a link
        links.append((str(meta.get("name") or f"my link ({path.stem})"), link,
                      str(meta.get("source") or f"measured: {path.name}")))
    return links
