"""The paper's own numbers (its tables and in-text figures as CSV, copied from paper/reference/), so every
table the project prints can stand next to them. Values are the paper's, on its hardware and models."""

from __future__ import annotations

import csv
from pathlib import Path

from moespac.errors import MoespacError

DIR = Path(__file__).parent


def read_reference(name: str) -> list[dict[str, str]]:
    """Rows of `NAME.csv` (e.g. 'appendix_stats') as dicts of strings."""
    path = DIR / f"{name}.csv"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in DIR.glob("*.csv")))
        raise MoespacError(f"no reference table {name!r}; known: {known}")
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def appendix_value(quantity: str, context: str | None = None) -> float | None:
    """One number from appendix_stats.csv (None when the paper gives none for that quantity/context)."""
    for row in read_reference("appendix_stats"):
        if row["quantity"] == quantity and (context is None or row["context"].lower() == context.lower()):
            return float(row["value"])
    return None
