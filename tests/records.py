"""Schema-valid result records for tests that need records of chosen values: a real simulated record of the tiny
study (fixtures/record_simulated.json), with the config, benchmark and tokens/s asked for and its config hash."""

import json
from pathlib import Path

import numpy as np

from moespac.hashing import stable_hash

FIXTURE = Path(__file__).parent / "fixtures" / "record_simulated.json"


def simulated_record(benchmark: str = "gsm8k", tps: float = 12.5, latency: float | None = None,
                     method: str | None = "moespac", **config) -> dict:
    """`method`: the table row the record is filed under (as `bench --method` writes it)."""
    rec = json.loads(FIXTURE.read_text())
    rec["method"] = method
    rec["config"].update(benchmark=benchmark, **config)
    rec["config_hash"] = stable_hash(rec["config"])
    rec["benchmark"].update(name=benchmark, display=benchmark, label=benchmark)
    rec["metrics"]["tokens_per_s"].update(mean=tps, std=0.5)
    spread = np.linspace(0.95, 1.05, len(rec["requests"])) if len(rec["requests"]) > 1 else [1.0]
    for r, f in zip(rec["requests"], spread):  # per-request values whose mean is tps (the cell's interval)
        r["tokens_per_s"] = tps * float(f)
    if latency is not None:
        rec["metrics"]["latency_s"]["mean"] = latency
    return rec
