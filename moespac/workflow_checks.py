"""The checks a workflow config gets before any job runs that its JSON schema cannot make: names that live in
the package's registries (benchmarks, methods and their policies, hardware, model specs, pairs) and limits that
depend on other config values."""

from __future__ import annotations

import math
import re
from pathlib import Path

from moespac.catalogue import get_method
from moespac.errors import MoespacError, check_context
from moespac.policy import SIGNALS

ENGINE_ONLY_SIGNALS = ("cross_layer_topk", "self_draft_topk")
"""Signals only the engine records (a router evaluation or a pass the serving stacks' routing logs do not have)."""


def _benchmark_names() -> set[str]:
    from moespac.datasets import BENCHMARKS

    return set(BENCHMARKS)


MICRO_CONTEXT = 4096
"""max_position_embeddings of every micro pair (moespac.models.micro; read there without importing transformers)."""


def built_config(pair: dict):
    """The proxy config (with its build_set overrides) of a pair the pipeline trains; None for any other pair."""
    if "build" not in pair:
        return None
    from moespac.models.proxy_config import get_config

    return get_config(pair["build"], dict(kv.split("=", 1) for kv in pair.get("build_set", [])))


def pair_shape(pair: dict) -> tuple[int | None, int] | None:
    """(MoE layers or None, context) of a pair the pipeline builds; None for a hub pair (known once downloaded)."""
    if "build" in pair:
        c = built_config(pair)
        return c.layers, c.context
    if "micro" in pair:
        return None, MICRO_CONTEXT
    return None


def pair_routing(pair: dict) -> tuple[int, int] | None:
    """(routed experts per layer, top-k) of a pair the pipeline trains; None for any other pair."""
    c = built_config(pair)
    return None if c is None else (c.experts, c.top_k)


def check_limits(config: dict) -> None:
    """Limits that depend on other config values, checked before any job (naming the key): generation length
    and draft window against the pair's context, the heatmap layer against the pair's layers, a batch against
    the prompts drawn per benchmark."""
    pairs = config["pairs"]
    sections = [("engine", config["engine"]), ("simulation", config["simulation"])]
    sections += [(f"wrapped.{name}", s) for name, s in config["wrapped"].items() if "max_new_tokens" in s]
    for key, section in sections:
        shape = pair_shape(pairs.get(section.get("pair"), {}))
        if shape is None or "max_new_tokens" not in section:
            continue
        n = section["max_new_tokens"]
        check_context(f"{key}.max_new_tokens {n}: a one-token prompt", 1, n, int(section.get("gamma") or 0),
                      shape[1], whose=f"pair {section['pair']!r}'s")
    shape = pair_shape(pairs.get(config["simulation"]["pair"], {}))
    layer = config["figures"]["heatmap_layer"]
    if shape is not None and shape[0] is not None and layer >= shape[0]:
        raise MoespacError(f"figures.heatmap_layer {layer}: pair {config['simulation']['pair']!r} has {shape[0]} "
                           f"MoE layers (0..{shape[0] - 1})")
    engine = config["engine"]
    if engine["limit"] is not None and engine["batch_size"] > engine["limit"]:
        raise MoespacError(f"engine.batch_size {engine['batch_size']} exceeds engine.limit {engine['limit']} "
                           "(the prompts drawn per benchmark): a batch needs that many prompts")
    check_imported(config)
    check_table3_plans(config)


def check_imported(config: dict) -> None:
    """An imported pair (a serving stack's routing, no models) can only be the simulation's pair, needs a file
    for every benchmark the simulated outputs read, holds single requests (batch 1), and lacks the router
    predictions some policies read."""
    from moespac.datasets import get_benchmark
    from moespac.registry import make_policy

    pairs = config["pairs"]
    imported = {name for name, p in pairs.items() if "imported" in p}
    for name in imported:
        for bench in pairs[name]["imported"]["files"]:
            try:
                get_benchmark(bench)
            except MoespacError as e:
                raise MoespacError(f"config key 'pairs.{name}.imported.files.{bench}': {e}") from None
    users = [("engine.pair", config["engine"]["pair"]), ("proxy_stats.pairs", config["proxy_stats"]["pairs"])]
    users += [(f"wrapped.{k}.pair", s.get("pair")) for k, s in config["wrapped"].items()]
    for key, value in users:
        for name in value if isinstance(value, list) else [value]:
            if name in imported:
                raise MoespacError(f"config key '{key}': pair {name!r} is imported routing (no models to run); "
                                   "only simulation.pair may name it")
    sim = config["simulation"]["pair"]
    if sim not in imported:
        return
    files = pairs[sim]["imported"]["files"]
    t4, sw, wi, figs = config["table4"], config["sweeps"], config["whatif"]["locality"], config["figures"]
    needed = [("benchmarks", b) for b in config["benchmarks"]]
    needed += [(f"{t}.benchmarks", b) for t in ("table2", "table3") if config[t]["activate"]
               for b in config[t]["benchmarks"]]
    needed += [("table4.benchmark", t4["benchmark"])] if t4["activate"] else []
    needed += [(f"sweeps.{k}.benchmark", v["benchmark"]) for k, v in sw.items() if v["activate"]]
    needed += [("whatif.locality.benchmark", wi["benchmark"])] if wi["activate"] else []
    needed += [("figures.fig4_benchmarks", b) for b in figs["fig4_benchmarks"]] + [("figures.heatmap_benchmark",
                                                                                      figs["heatmap_benchmark"])]
    for key, bench in needed:
        if get_benchmark(bench).name not in {get_benchmark(b).name for b in files}:
            raise MoespacError(f"config key '{key}': benchmark {bench!r} has no file in pairs.{sim}.imported.files "
                               f"(simulation.pair {sim!r} is imported)")
    batches = [("simulation.batch_size", [config["simulation"]["batch_size"]])]
    batches += [("table4.batch_sizes", t4["batch_sizes"])] if t4["activate"] else []
    batches += [("sweeps.batch.values", sw["batch"]["values"])] if sw["batch"]["activate"] else []
    for key, values in batches:
        if any(int(v) > 1 for v in values):
            raise MoespacError(f"config key '{key}': {values}: imported routing (simulation.pair {sim!r}) is one "
                               "request at a time; batches need the engine's traces (set batch 1 or deactivate)")
    sections = [("table1.methods", config["table1"]["methods"])]
    sections += [(f"{t}.methods", config[t]["methods"]) for t in ("table2", "table3") if config[t]["activate"]]
    sections += [(f"sweeps.{k}.methods", v["methods"]) for k, v in sw.items() if v["activate"]]
    sections += [("whatif.locality.methods", wi["methods"])] if wi["activate"] else []
    for key, methods in sections:
        for m in methods:
            needs = [s for s in make_policy(get_method(m).policy).requires if s in ENGINE_ONLY_SIGNALS]
            if needs:
                raise MoespacError(f"config key '{key}': method {m!r} reads {needs[0]!r} ({SIGNALS[needs[0]]}), "
                                   f"which imported routing (simulation.pair {sim!r}) lacks")


def check_names(config: dict) -> None:
    """Raise MoespacError naming the config key whose value is not a known benchmark, method (and its
    policy spec), hardware profile or model spec. The schema has already checked shapes and types."""
    from moespac.models.specs import PAPER_MODELS
    from moespac.registry import make_policy
    from moespac.sim.profile import builtin_profiles

    benchmarks, hardware = _benchmark_names(), set(builtin_profiles())

    def need(key: str, value, known: set[str], what: str) -> None:
        if value not in known:
            raise MoespacError(f"config key '{key}': unknown {what} {value!r}; known: {', '.join(sorted(known))}")

    def policy(key: str, spec: str) -> None:
        try:
            make_policy(spec)
        except (MoespacError, TypeError) as e:  # TypeError: options given to a policy that takes none
            raise MoespacError(f"config key '{key}': policy {spec!r}: {e}") from None

    def method(key: str, slug: str) -> None:
        try:
            spec = get_method(slug).policy
        except MoespacError as e:
            raise MoespacError(f"config key '{key}': {e}") from None
        policy(key, spec)

    for key, value in walk(config):
        leaf = key.rsplit(".", 1)[-1].split("[", 1)[0]
        if leaf in ("benchmarks", "benchmark"):
            need(key, value, benchmarks, "benchmark")
        elif leaf in ("methods", "method"):
            method(key, value)
        elif leaf == "hardware":
            need(key, value, hardware, "hardware profile")
        elif leaf in ("model_spec", "draft_spec", "spec"):
            need(key, value, set(PAPER_MODELS), "model spec")
        elif leaf == "policy":
            policy(key, value)
    pairs = config.get("pairs", {})
    for key, value in walk(config):
        if key.rsplit(".", 1)[-1].split("[")[0] in ("pair", "trace_pair", "pairs", "fallback_pair"):  # pairs[i]: names
            need(key, value, set(pairs), "model pair (a key of 'pairs')")


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def validate_config(config: dict, schema: dict | str | Path) -> None:
    """The JSON schema's verdict in one line naming the key (not the whole schema, as jsonschema prints it), after
    refusing what JSON Schema lets through: NaN and infinity pass every `minimum`/`maximum` test."""
    import jsonschema
    import yaml

    for key, value in walk(config):
        if isinstance(value, float) and not math.isfinite(value):
            raise MoespacError(f"config key {key}: {value} is not a finite number")
    if isinstance(schema, dict):
        spec = schema
    else:
        with open(schema) as f:
            spec = yaml.safe_load(f)
    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(spec)(spec).iter_errors(config))
    if error is not None:
        key = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in error.absolute_path).replace(".[", "[")
        message = error.message if len(error.message) <= 300 else error.message[:300] + " ..."
        raise MoespacError(f"config key {key or '(top level)'}: {message}")
    for name, pair in config.get("pairs", {}).items():
        for role in ("target", "draft"):
            ref = pair.get(role)
            if ref and not HUB_ID.match(ref):
                raise MoespacError(f"config key pairs.{name}.{role}: {ref!r} is not a hub id (org/name); the workflow "
                                   "downloads hub pairs (a local pair: `build`, or `moespac bench --target DIR`)")


def walk(obj, prefix: str = ""):
    """(dotted key, leaf value) for every scalar in a nested config; list items as key[i]."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from walk(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from walk(v, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def check_table3_plans(config: dict) -> None:
    """A Table 3 entry with a `fallback_pair` is decided by the memory plan of its `pair` (a hub pair traced on
    this machine); the fallback's routing must have the model's experts and top-k, as every entry's trace must. A
    hub pair without a draft can only be such an entry's pair (it cannot record a speculative trace)."""
    from moespac.models.specs import get_spec

    pairs = config["pairs"]
    for i, e in enumerate(config["table3"]["models"]):
        if "fallback_pair" not in e:
            continue
        key = f"table3.models[{i}]"
        if "target" not in pairs[e["pair"]]:
            raise MoespacError(f"config key '{key}.pair': {e['pair']!r} is not a hub pair (target/draft); only a "
                               "pair this machine traces has a memory plan to decide by (drop fallback_pair)")
        routing, spec = pair_routing(pairs[e["fallback_pair"]]), get_spec(e["spec"])
        if routing is not None and routing != (spec.num_experts, spec.top_k):
            raise MoespacError(f"config key '{key}.fallback_pair': {e['fallback_pair']!r} routes {routing[0]} experts "
                               f"top-{routing[1]}, {e['spec']} {spec.num_experts} top-{spec.top_k}: its trace would "
                               "leave experts dead or route the wrong count (use a routing-shape pair of that shape)")
    users = [("engine.pair", config["engine"]["pair"]), ("simulation.pair", config["simulation"]["pair"])]
    users += [(f"wrapped.{k}.pair", s.get("pair")) for k, s in config["wrapped"].items()]
    users += [(f"table3.models[{i}].pair", e.get("pair")) for i, e in enumerate(config["table3"]["models"])
              if "fallback_pair" not in e]
    for key, name in users:
        p = pairs.get(name) or {}
        if "target" in p and "draft" not in p:
            raise MoespacError(f"config key '{key}': hub pair {name!r} names no draft (pairs.{name}.draft); only a "
                               "Table 3 entry with a fallback_pair may use it")


def table3_choice(entry: dict, plan: dict, pairs: dict, needs_draft: bool) -> tuple[str, str]:
    """(the pair whose traces a Table 3 entry replays, why): its own `pair` when the memory plan says the pair fits
    this machine and a draft is named (or no method drafts), else its labelled `fallback_pair`."""
    own, fallback = entry["pair"], entry["fallback_pair"]
    if not plan.get("fits"):
        return fallback, f"{own} does not fit this machine ({plan.get('reason')})"
    if needs_draft and "draft" not in pairs[own]:
        return fallback, f"{own} names no draft (pairs.{own}.draft), and speculative methods need one"
    return own, f"{own} fits this machine ({plan.get('slots')} of {plan.get('total_slots')} expert slots)"
