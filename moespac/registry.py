"""Policy registry: `name[:key=value,...]` -> a Policy instance.

An explicit map, name -> (module, class), as vLLM's model registry is: reading it says which file each policy
lives in, and a policy module is imported only when its name is asked for (nothing scans a package). A new
baseline is one file in baselines/ and one line here; tests/test_baselines.py checks that the two agree.
Options after ':' become constructor keywords.
"""

from __future__ import annotations

import importlib
import inspect

from moespac.errors import MoespacError
from moespac.policy import Policy, check_signals

POLICIES: dict[str, tuple[str, str]] = {
    "moespac": ("moespac.scheduler.policy", "MoESpAc"),
    "accelerate": ("baselines.accelerate", "Accelerate"),
    "all-host": ("baselines.all_host", "AllHost"),
    "fate": ("baselines.fate", "Fate"),
    "fiddler": ("baselines.fiddler", "Fiddler"),
    "hybrimoe": ("baselines.hybrimoe", "HybriMoE"),
    "ktransformers": ("baselines.ktransformers", "KTransformers"),
    "lfu": ("baselines.lfu", "LFU"),
    "llamacpp": ("baselines.llamacpp", "LlamaCpp"),
    "llamacpp-sd": ("baselines.llamacpp", "LlamaCppSD"),
    "lru": ("baselines.lru", "LRU"),
    "mixtral-offloading": ("baselines.mixtral_offloading", "MixtralOffloading"),
    "moe-infinity": ("baselines.moe_infinity", "MoEInfinity"),
    "moe-speq": ("baselines.moe_speq", "MoESpeQ"),
    "oracle": ("baselines.oracle", "Oracle"),
    "sp-moe": ("baselines.sp_moe", "SPMoE"),
    "specexp": ("baselines.specexp", "SpecExp"),
    "vllm-offload": ("baselines.vllm_offload", "VLLMOffload"),
}
"""Every policy by the name a spec uses: (module, class)."""


def policy_class(name: str) -> type[Policy]:
    """The class of one registered policy (imports its module on first use)."""
    module, cls = POLICIES[name]
    found = getattr(importlib.import_module(module), cls)
    if not (inspect.isclass(found) and issubclass(found, Policy) and found.name == name):
        raise RuntimeError(f"registry entry {name!r} -> {module}.{cls} is not a Policy named {name!r}")
    return found


_CACHE: dict[str, type[Policy]] | None = None


def policies() -> dict[str, type[Policy]]:
    """Every registered policy's class, by name."""
    global _CACHE
    if _CACHE is None:
        _CACHE = {name: policy_class(name) for name in POLICIES}
    return _CACHE


def _parse_value(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(v.lower(), v)


def parse_policy(spec: str) -> tuple[str, dict]:
    name, _, opts = spec.partition(":")
    kwargs = {}
    for item in filter(None, opts.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise MoespacError(f"policy option {item!r} in {spec!r} is not key=value")
        key = key.strip().replace("-", "_")
        if key in kwargs:
            raise MoespacError(f"policy option {key!r} given twice in {spec!r}")
        kwargs[key] = _parse_value(value.strip())
    return name.strip(), kwargs


def make_policy(spec: str) -> Policy:
    """Build a policy from `name[:key=value,...]`; unknown names/options fail naming them."""
    name, kwargs = parse_policy(spec)
    table = policies()
    if name not in table:
        raise MoespacError(f"unknown policy {name!r}; known: {', '.join(sorted(table))}")
    cls = table[name]
    # a policy without its own __init__ inherits object's (*args, **kwargs): it takes no options
    params = {} if cls.__init__ is object.__init__ else inspect.signature(cls.__init__).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key in kwargs:
        if key not in params and not accepts_any:
            allowed = sorted(k for k in params if k != "self")
            raise MoespacError(f"policy {name!r} has no option {key!r}; options: {', '.join(allowed) or 'none'}")
    return cls(**kwargs)


def policies_runnable_with(signals) -> list[str]:
    """Registered policy names whose needs (the draft, other signals) `signals` meets, sorted."""
    out = []
    for name, cls in sorted(policies().items()):
        try:
            check_signals(cls, signals)  # the check a run makes at reset, on the class's declared needs
        except MoespacError:
            continue
        out.append(name)
    return out
