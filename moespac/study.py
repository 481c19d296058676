"""The paper's study as data: which policy each table row is, the paper's name for it, and the checks a
workflow config gets before any job runs (names of benchmarks, methods, policies, hardware, model specs).

A *method* is a row of a paper table: a policy spec from the registry plus whether it decodes with a draft
(speculative decoding, SD) or without one (autoregressive, AR). Its trace must match: an SD method replays a
trace recorded with the draft, an AR method one recorded without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moespac.errors import MoespacError, check_context


@dataclass(frozen=True)
class Method:
    """One row of a paper table."""

    policy: str
    """Policy spec for `make_policy` (name[:key=value,...])."""
    label: str
    """The paper's name for the row (matches moespac/reference/*.csv)."""
    draft: bool
    """True: speculative decoding with the draft; False: autoregressive decoding."""


METHODS: dict[str, Method] = {
    # Table 1 (Section 4.2); SD or AR as the paper ran each system
    "accelerate": Method("accelerate", "Accelerate", False),
    "vllm": Method("vllm-offload", "vLLM", False),
    "llamacpp": Method("llamacpp", "llama.cpp", False),
    "llamacpp-sd": Method("llamacpp-sd", "llama.cpp-w/ SD", True),
    # llama.cpp's other placement, likely the paper's: every layer's routed experts on the CPU (`-ot exps=CPU`,
    # i.e. --cpu-moe); the rows above keep as many whole layers' experts on the GPU as fit (--n-cpu-moe N)
    "llamacpp-cpu-moe": Method("llamacpp:cpu_moe=true", "llama.cpp -ot exps=CPU", False),
    "llamacpp-cpu-moe-sd": Method("llamacpp-sd:cpu_moe=true", "llama.cpp-w/ SD -ot exps=CPU", True),
    "mixtral-offload": Method("mixtral-offloading", "Mixtral Offload", False),
    "moe-infinity": Method("moe-infinity", "MoE-Infinity", False),
    "specexp": Method("specexp", "SpecExp", False),
    "moe-speq": Method("moe-speq", "MoE-SpeQ", True),
    "sp-moe": Method("sp-moe", "SP-MoE", True),
    "fate": Method("fate", "Fate", False),
    "hybrimoe": Method("hybrimoe", "HybriMoE", False),
    "moespac": Method("moespac", "MoE-SpAc", True),
    # Table 2 (Section 4.4): one component removed each
    "moespac-no-specue": Method("moespac:ablation=no-specue", "w/o SpecUE", True),
    "moespac-no-adabc": Method("moespac:ablation=no-adabc", "w/o AdaBC", True),
    "moespac-no-hetwb": Method("moespac:ablation=no-hetwb", "w/o HetWB", True),
    "moespac-no-sg-prefetcher": Method("moespac:ablation=no-sg-prefetcher", "w/o SG-Prefetcher", True),
    "moespac-no-sg-evictor": Method("moespac:ablation=no-sg-evictor", "w/o SG-Evictor", True),
    "moespac-no-sd": Method("moespac:ablation=no-sd", "w/o SD (AR Mode)", False),
    # the released code's constants (K=5, theta 5/1, tau=1) instead of the paper's
    "moespac-released": Method("moespac:variant=released-code", "MoE-SpAc (released code)", True),
    # references: not in the paper's tables
    "lru": Method("lru", "LRU (reference)", False),
    "lru-sd": Method("lru", "LRU w/ SD (reference)", True),
    "oracle-sd": Method("oracle", "Offline oracle w/ SD (reference)", True),
}

# Table 2 calls the full system "MoE-SpAc (Full)"
TABLE2_LABELS = {"moespac": "MoE-SpAc (Full)"}

_K_SWEEP = re.compile(r"^(?P<base>[a-z0-9-]+)-k(?P<K>[0-9]+)$")


def get_method(slug: str) -> Method:
    """A catalogue method, or a K-sweep variant `<moespac method>-k<K>` (e.g. moespac-k6)."""
    if slug in METHODS:
        return METHODS[slug]
    m = _K_SWEEP.match(slug)
    if m and m["base"] in METHODS and METHODS[m["base"]].policy.startswith("moespac"):
        base = METHODS[m["base"]]
        sep = "," if ":" in base.policy else ":"
        return Method(f"{base.policy}{sep}K={int(m['K'])}", f"{base.label} K={int(m['K'])}", base.draft)
    raise MoespacError(f"unknown method {slug!r}; known: {', '.join(METHODS)} (or <moespac method>-k<K>)")


def k_method(K: int, base: str = "moespac") -> str:
    return f"{base}-k{K}"


def paper_label(slug: str) -> str:
    return get_method(slug).label


# ---- config checks the JSON schema cannot make: names that live in the package's registries

def _benchmark_names() -> set[str]:
    from moespac.bench.datasets import BENCHMARKS

    return set(BENCHMARKS)


MICRO_CONTEXT = 4096
"""max_position_embeddings of every micro pair (moespac.models.micro; read there without importing transformers)."""


def pair_shape(pair: dict) -> tuple[int | None, int] | None:
    """(MoE layers or None, context) of a pair the pipeline builds; None for a hub pair (known once downloaded)."""
    if "build" in pair:
        from moespac.models.proxy_config import get_config

        c = get_config(pair["build"], dict(kv.split("=", 1) for kv in pair.get("build_set", [])))
        return c.layers, c.context
    if "micro" in pair:
        return None, MICRO_CONTEXT
    return None


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


def check_imported(config: dict) -> None:
    """An imported pair (a serving stack's routing, no models) can only be the simulation's pair, needs a file
    for every benchmark the simulated outputs read, holds single requests (batch 1), and lacks the router
    predictions some policies read."""
    from moespac.bench.datasets import get_benchmark
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
    needed += [(f"{t}.benchmarks", b) for t in ("table2", "table3") if config[t]["activate"] for b in config[t]["benchmarks"]]
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
            needs = [s for s in make_policy(get_method(m).policy).requires if s == "cross_layer_topk"]
            if needs:
                raise MoespacError(f"config key '{key}': method {m!r} reads the next layer's router predictions "
                                   f"('cross_layer_topk'), which imported routing (simulation.pair {sim!r}) lacks")


def check_names(config: dict) -> None:
    """Raise MoespacError naming the config key whose value is not a known benchmark, method (and its
    policy spec), hardware profile or model spec. The schema has already checked shapes and types."""
    from moespac.models.registry import PAPER_MODELS
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
        if key.rsplit(".", 1)[-1].split("[")[0] in ("pair", "trace_pair", "pairs"):  # pairs[i]: a list of names
            need(key, value, set(pairs), "model pair (a key of 'pairs')")


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
