"""Stable config hashes: the same resolved config always names the same run."""

from __future__ import annotations

import dataclasses
import hashlib
import json


def canonical(obj):
    """Plain JSON-able form of dataclasses / dicts / sequences (sorted keys)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, (frozenset, set)):
        return sorted(canonical(v) for v in obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return obj


def stable_hash(obj, length: int = 12) -> str:
    """sha256 of the canonical JSON of `obj`, first `length` hex digits."""
    text = json.dumps(canonical(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]
