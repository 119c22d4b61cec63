"""The article's worked cases of the time budget (data/budget_cases.json, notebook 08): each case
changes some inputs of the base case and lists the figures the article prints for it.

`load_cases` reads the file; `cases_table` evaluates every case with labutils.model.budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from labutils.model.budget import evaluate

CASES_FILE = Path(__file__).resolve().parents[2] / "data" / "budget_cases.json"


def load_cases(path: str | Path = CASES_FILE) -> list[dict]:
    """The worked cases of data/budget_cases.json: name, changes, inputs (all seven), printed figures."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    return [{**case, "inputs": {**doc["base_case"], **case.get("changes", {})}} for case in doc["cases"]]


def cases_table(path: str | Path = CASES_FILE) -> pd.DataFrame:
    """The worked cases as a pandas DataFrame: what changed, T1, H, T2, speedup, break-even, and what
    the article prints."""
    rows = []
    for case in load_cases(path):
        b = evaluate(**case["inputs"])
        rows.append({"case": case["name"],
                     "change": ", ".join(f"{k}={v:g}" for k, v in case.get("changes", {}).items()) or "-",
                     "T1 (ms)": b.t_one_ms, "H (ms)": b.comm_ms, "T2 (ms)": b.t_two_ms,
                     "speedup": b.speedup, "break-even C (ms)": b.break_even_C_ms,
                     "article prints": ", ".join(f"{k} {v}" for k, v in case["printed"].items())})
    return pd.DataFrame(rows).set_index("case")
