"""Result records: one self-describing JSON per measured / simulated / wrapped run."""

from __future__ import annotations

import time

from moespac.environment import cpu_snapshot, environment, machine_load, software_environment
from moespac.errors import MoespacError
from moespac.hashing import stable_hash

TIMINGS = ("measured", "simulated", "wrapped")
RECORD_VERSION = 1
_STAMP = "%Y-%m-%dT%H:%M:%SZ"
_started: float | None = None
_cpu_at_start = None


def mark_started() -> None:
    """Note when the command began (moespac.cli calls it first): a timed record says when its run started and how
    busy the machine was with other work since."""
    global _started, _cpu_at_start
    _started = time.time()
    _cpu_at_start = cpu_snapshot()


def make_record(kind: str, timing: str, config: dict, metrics: dict, **extra) -> dict:
    """A record: config and its stable hash, environment, timing label, metrics, and anything extra.

    A simulated record carries no clock reading and no machine facts, only the software that computed it:
    its numbers do not depend on the machine, so two runs of one commit write byte-identical records.
    Measured and wrapped records say when and on what machine they ran, and how busy it was with other work."""
    if timing not in TIMINGS:
        raise MoespacError(f"timing label {timing!r}: one of {', '.join(TIMINGS)}")
    timeless = timing == "simulated" and kind != "failure"  # a failure says when it happened
    now = time.time()
    when = {} if timeless else dict(started=time.strftime(_STAMP, time.gmtime(min(_started or now, now))),
                                    created=time.strftime(_STAMP, time.gmtime(now)),
                                    machine_load=machine_load(_cpu_at_start))
    env = software_environment() if timeless else environment()
    return dict(record_version=RECORD_VERSION, kind=kind, timing=timing, config=config,
                config_hash=stable_hash(config), environment=env, **when, metrics=metrics, **extra)


