"""Argument builders shared by the engine commands (the engine itself is set up by moespac.engine.session)."""

from __future__ import annotations

import argparse
import math

from moespac.configargs import add_field_args
from moespac.errors import MoespacError, check_unit_interval


def floats(text: str) -> list[float]:
    values = [finite(x) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    return values


def finite(text: str) -> float:
    """A float that is a number (argparse type): nan and inf are refused where they are parsed."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return x


MAX_GIB = 2.0**20  # a mebibyte of GiB: more memory than any machine, small enough that bytes stay exact integers


def gib(text: str) -> float:
    """A memory size in GiB (argparse type): finite, not negative, at most MAX_GIB."""
    x = finite(text)
    if not 0 <= x <= MAX_GIB:
        raise argparse.ArgumentTypeError(f"expected GiB in [0, {MAX_GIB:.0f}], got {text!r}")
    return x


def ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def add_model_args(p: argparse.ArgumentParser, draft_required: bool = False, target_required: bool = True) -> None:
    """The models a session loads, as EngineConfig documents them."""
    from moespac.engine.session import EngineConfig

    g = p.add_argument_group("models")
    add_field_args(g, EngineConfig, "target", "draft", "dtype", "device", "trust_remote_code",
                   target=dict(required=target_required), draft=dict(required=draft_required))


def add_engine_args(p: argparse.ArgumentParser, gamma_default: int = 8) -> None:
    from moespac.engine.session import EngineConfig

    g = p.add_argument_group("engine")
    add_field_args(g, EngineConfig, "policy")
    g.add_argument("--gamma", type=int, default=gamma_default, help="draft length")
    add_memory_args(g)
    add_cache_args(g, "per_layer")
    add_field_args(g, EngineConfig, "copy_mode", copy_mode=dict(choices=["async", "sync"]))


def add_cache_args(g, *names: str) -> None:
    """The device expert cache's flags (all three by default), from CacheSize's fields: one spelling and one help
    for the engine commands and the simulator."""
    from moespac.cache import CacheSize

    add_field_args(g, CacheSize, *(names or ("cache_ratio", "cache_gib", "per_layer")), cache_ratio=dict(type=finite),
                   cache_gib=dict(type=gib), per_layer=dict(flag="--per-layer-cache"))


def add_memory_args(g) -> None:
    """The memory plan's budgets and the explicit slot-pool overrides it checks (`moespac plan`), as EngineConfig
    documents them."""
    from moespac.engine.session import EngineConfig

    add_cache_args(g, "cache_ratio", "cache_gib")
    add_field_args(g, EngineConfig, "gpu_gib", "host_gib", gpu_gib=dict(type=gib), host_gib=dict(type=gib))


def check_engine_args(args) -> None:
    """Validate before any model is loaded, so bad input fails fast and writes nothing."""
    if getattr(args, "draft", None) and args.gamma < 1:
        raise MoespacError(f"--gamma {args.gamma} must be >= 1")
    check_unit_interval("--cache-ratio", args.cache_ratio)  # the flag the user typed, named as typed
