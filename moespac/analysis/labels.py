"""Does every number on a Markdown page carry its label? The project's rule (DESIGN.md): a number says how it
was obtained: measured, simulated or wrapped, the paper's own, or "timing: none" for counts and statistics no
clock was read for. A number is labelled by its own line, by the S / M / W marker after a table cell's value, or by
a heading above it (its section's, or one that section sits under)."""

from __future__ import annotations

import re

TIMING = re.compile(r"\b(measured|simulated|wrapped|timing: none|the paper's numbers)\b", re.IGNORECASE)
"""A label that may head a block (and the blocks under it): every number there was obtained that way."""
LABEL = re.compile(TIMING.pattern + r"|\bpaper(?:'s)?\b", re.IGNORECASE)
"""A label on the line itself (the paper's numbers are labelled where they stand, never by a heading)."""
CELL_MARK = re.compile(r"\d\s[SMW]\b")  # "16.42 S": the tables' per-cell label
NUMBER = re.compile(r"(?<![\w.@/#-])[-+]?\d+(?:\.\d+)?(?![\w/-])")
"""A standalone number: not part of a name (Qwen3-30B, x86_64, @3f2a...), a path or a heading anchor."""


def unlabelled(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line with a number that neither it nor a heading above it labels."""
    out, chain, fenced = [], {}, False  # chain: heading level -> whether that heading labels
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else re.match(r"(#+)\s", line)
        if heading:
            level = len(heading.group(1))
            chain = {k: v for k, v in chain.items() if k < level} | {level: bool(TIMING.search(line))}
            continue
        if re.fullmatch(r"\|?[\s|:-]*", line):  # blank lines and table rules
            continue
        if NUMBER.search(line) and not (any(chain.values()) or LABEL.search(line) or CELL_MARK.search(line)):
            out.append((i, line))
    return out
