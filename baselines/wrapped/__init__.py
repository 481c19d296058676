"""External systems run as their authors ship them; every run writes a result record with timing 'wrapped'.

The policy registry imports this package while it looks for Policy subclasses in baselines/, so this file
stays cheap: it only names the systems and the module that runs each one (imported on use).
"""

from __future__ import annotations

import importlib

SYSTEMS = {
    "llamacpp": "baselines.wrapped.llamacpp",
    "accelerate": "baselines.wrapped.accelerate",
    "vllm": "baselines.wrapped.vllm",
    "moespac-release": "baselines.wrapped.moespac_release",
}
"""Command name -> module with `add_arguments(parser)`, `run_benchmark(args) -> record` and `main(args) -> int`."""


def system_module(name: str):
    """The module that wraps system `name` (a key of SYSTEMS)."""
    return importlib.import_module(SYSTEMS[name])
