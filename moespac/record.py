"""Result records: one self-describing JSON per measured / simulated / wrapped run."""

from __future__ import annotations

import time

from moespac.atomic import write_json
from moespac.environment import environment
from moespac.errors import MoespacError
from moespac.hashing import stable_hash

TIMINGS = ("measured", "simulated", "wrapped")
RECORD_VERSION = 1


def make_record(kind: str, timing: str, config: dict, metrics: dict, **extra) -> dict:
    """A record: config and its stable hash, environment, timing label, metrics, and anything extra."""
    if timing not in TIMINGS:
        raise MoespacError(f"timing label {timing!r}: one of {', '.join(TIMINGS)}")
    return dict(record_version=RECORD_VERSION, kind=kind, timing=timing, config=config,
                config_hash=stable_hash(config), environment=environment(), created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                metrics=metrics, **extra)


def write_record(path, record: dict) -> None:
    write_json(path, record)
