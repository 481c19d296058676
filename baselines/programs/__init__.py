"""External programs run as their authors ship them (the real systems, not the policies of baselines/*.py); every run
writes a result record with timing 'wrapped'.

The policy registry's test (tests/test_baselines.py) imports this package while it looks for Policy subclasses in
baselines/, so this file stays cheap: it only names the systems and the module that runs each one (imported on use).
"""

from __future__ import annotations

import importlib

SYSTEMS = {
    "llamacpp": "baselines.programs.llamacpp",
    "accelerate": "baselines.programs.accelerate",
    "vllm": "baselines.programs.vllm",
    "moespac-release": "baselines.programs.moespac_release",
}
"""Command name -> module with `add_arguments(parser)`, `run_benchmark(args) -> record` and `main(args) -> int`."""


def system_module(name: str):
    """The module that wraps system `name` (a key of SYSTEMS)."""
    return importlib.import_module(SYSTEMS[name])
