"""A deterministic offline prompt source for engine checks (benchmark prompt sets live in moespac/bench)."""

from __future__ import annotations

import random


def builtin_prompts(n: int, seed: int = 0, max_chars: int = 200) -> list[str]:
    """`n` short prompts cut from Python's own documentation (ships with Python, so always offline)."""
    from pydoc_data.topics import topics

    paragraphs = [p.strip() for t in topics.values() for p in t.split("\n\n")]
    paragraphs = sorted({p[:max_chars] for p in paragraphs if 40 <= len(p) and p[0].isalpha()})
    rng = random.Random(seed)
    return rng.sample(paragraphs, min(n, len(paragraphs)))
