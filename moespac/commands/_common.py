"""Argument builders shared by the engine commands (the engine itself is set up by moespac.engine.session)."""

from __future__ import annotations

import argparse
import math

from moespac.configargs import add_field_args
from moespac.errors import MoespacError, check_unit_interval


def floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def finite(text: str) -> float:
    """A float that is a number (argparse type): nan and inf are refused where they are parsed."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return x


def ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_model_args(p: argparse.ArgumentParser, draft_required: bool = False, target_required: bool = True) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", required=target_required, help="target MoE model: local folder or hub id")
    g.add_argument("--draft", required=draft_required, default=None,
                   help="draft model (local folder or hub id); omit for autoregressive decoding")
    g.add_argument("--dtype", default="auto", help="auto, fp32, bf16, fp16 or fp64")
    g.add_argument("--device", default=None, help="device for non-expert weights and the expert cache (default: cuda if available)")
    g.add_argument("--trust-remote-code", action="store_true", help="allow model code from the hub (off by default)")


def add_engine_args(p: argparse.ArgumentParser, gamma_default: int = 8) -> None:
    from moespac.engine.session import EngineConfig

    g = p.add_argument_group("engine")
    add_field_args(g, EngineConfig, "policy")
    g.add_argument("--gamma", type=int, default=gamma_default, help="draft length")
    add_memory_args(g)
    g.add_argument("--per-layer-cache", action="store_true", help="partition slots per layer instead of one global pool")
    add_field_args(g, EngineConfig, "copy_mode", copy_mode=dict(choices=["async", "sync"]))


def add_memory_args(g) -> None:
    """The memory plan's budgets and the explicit slot-pool overrides it checks (`moespac plan`), as EngineConfig
    documents them."""
    from moespac.engine.session import EngineConfig

    names = ("cache_ratio", "cache_gib", "gpu_gib", "host_gib")
    add_field_args(g, EngineConfig, *names, **{n: dict(type=finite) for n in names})


def check_output_paths(args, *names: str) -> None:
    """Output files named by these options must not be folders (checked before any work, not at the end)."""
    from pathlib import Path

    for name in names:
        value = getattr(args, name, None)
        if value and Path(value).is_dir():
            raise MoespacError(f"--{name.replace('_', '-')} {value}: is a folder; give a file path to write")


def check_engine_args(args) -> None:
    """Validate before any model is loaded, so bad input fails fast and writes nothing."""
    check_output_paths(args, "json", "trace", "out")
    if getattr(args, "draft", None) and args.gamma < 1:
        raise MoespacError(f"--gamma {args.gamma} must be >= 1")
    check_unit_interval("--cache-ratio", args.cache_ratio)


def add_warmup_steps_arg(g) -> None:
    """--warmup-steps of the simulator (`moespac simulate`, `moespac bench --timing simulated`)."""
    g.add_argument("--warmup-steps", type=int, default=None, metavar="N",
                   help="simulated: steps of the trace's first request whose routing counts are the "
                        "'warmup_counts' signal (Fiddler-style profiling); 0 = no such signal (default: 16)")


def add_profile_trace_arg(g) -> None:
    """--profile-trace of the simulator: the profiling run of static placements and MoE-Infinity."""
    g.add_argument("--profile-trace", action="append", default=[], metavar="TRACE",
                   help="simulated: a trace of other prompts (never the replayed ones) whose routing is the "
                        "profiling run of static placements and MoE-Infinity's activation matrices; repeatable "
                        "(without it: the first --warmup-steps steps of the replayed trace, labelled so)")


def warmup_steps_option(args) -> dict:
    """{'warmup_steps': N} when --warmup-steps was given (else {}: the simulator's default); checked here."""
    if args.warmup_steps is None:
        return {}
    if args.warmup_steps < 0:
        raise MoespacError(f"--warmup-steps {args.warmup_steps} must be >= 0")
    return dict(warmup_steps=args.warmup_steps)
