"""Policy registry: `name[:key=value,...]` -> a Policy instance.

Baselines are discovered from the `baselines` package (one module per policy, each defining Policy
subclasses); MoE-SpAc comes from moespac.scheduler.policy. Options after ':' become constructor keywords.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from moespac.errors import MoespacError
from moespac.policy import Policy, check_signals

_EXTRA_MODULES = ("moespac.scheduler.policy",)


def _discover() -> dict[str, type[Policy]]:
    import baselines

    found: dict[str, type[Policy]] = {}
    modules = [f"baselines.{m.name}" for m in pkgutil.iter_modules(baselines.__path__) if not m.name.startswith("_")]
    for modname in modules + list(_EXTRA_MODULES):
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:  # optional module not present
                continue
            raise
        for obj in vars(mod).values():
            if inspect.isclass(obj) and issubclass(obj, Policy) and obj is not Policy and obj.__module__ == mod.__name__:
                if obj.name in found and found[obj.name] is not obj:
                    raise RuntimeError(f"policy name {obj.name!r} defined twice ({found[obj.name].__module__}, {modname})")
                found[obj.name] = obj
    return found


_CACHE: dict[str, type[Policy]] | None = None


def policies() -> dict[str, type[Policy]]:
    global _CACHE
    if _CACHE is None:
        _CACHE = _discover()
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
