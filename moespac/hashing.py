"""Stable hashes: the same resolved config always names the same run, the same model folder the same model."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path


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


def model_id(ref: str | None) -> str | None:
    """`parent/folder@hash` of a local model folder (its JSON files and weights), or the hub id as given.

    Weight files up to 256 MiB are hashed whole; larger ones by their size and first MiB (safetensors
    header: tensor names, shapes, offsets), so that naming a 60 GB model does not read it.
    """
    if not ref:
        return None
    folder = Path(ref).expanduser()
    if not folder.is_dir():
        return ref
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.suffix in (".json", ".safetensors"):
            size = f.stat().st_size
            h.update(f"{f.name}:{size}:".encode())
            with open(f, "rb") as fh:
                h.update(fh.read() if size <= 256 * 2**20 else fh.read(2**20))
    return f"{folder.resolve().parent.name}/{folder.name}@{h.hexdigest()[:12]}"
