"""One simulated run: trace + policy + hardware profile + model spec -> a result record (timing: simulated)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moespac.cache import CacheSize
from moespac.errors import MoespacError
from moespac.models.specs import ModelSpec, get_spec
from moespac.policy import UnitCosts
from moespac.record import make_record
from moespac.registry import make_policy, parse_policy
from moespac.sim.bounds import infinite_cache
from moespac.sim.cost import CostModel
from moespac.sim.profile import load_profile
from moespac.sim.replay import replay, warmup_window
from moespac.sim.workload import make_workload
from moespac.trace import Trace, load_trace

DEFAULT_DRAFT = "qwen3-4b-fp8"  # the paper's draft for Qwen3-30B-A3B (section 4.1)


@dataclass(frozen=True)
class SimConfig(CacheSize):
    """What to simulate (the device expert cache: CacheSize's fields)."""

    trace: str
    """Trace file (.npz) from the engine or a synthetic one."""
    policy: str
    """Scheduling policy, name[:key=value,...]."""
    hardware: str
    """Built-in profile name or a profile YAML path."""
    model_spec: str = "trace"
    """Registry name whose expert sizes are simulated, or 'trace' for the spec stored in the trace."""
    draft_spec: str | None = None
    """Registry name of the draft; None = the trace's draft spec if it has one, else qwen3-4b-fp8."""
    expert_dtype: str | None = None
    """Dtype of expert weights (bytes per copy); None = the spec's dtype."""
    allow_topology_mismatch: bool = False
    """Map trace layers/experts onto the spec by modulo when the topologies differ (recorded)."""
    warm_cache: bool = False
    """Keep cache and policy state across requests (default: every request starts cold, like the engine)."""
    bounds: bool = True
    """Also compute the infinite-cache bound and the oracle, and the policy's distance to them."""
    warmup_steps: int = 16
    """Profiling window of the 'warmup_counts' signal (Fiddler, kTransformers' frequency placement): the
    activation counts of the first this-many steps of the trace's first request; 0 = no such signal. Used only
    without profile_traces (that request is also replayed: the placement then sees part of its future)."""
    profile_traces: tuple[str, ...] = ()
    """Traces of other prompts, never the replayed ones: their routing is the profiling run that static
    placements ('warmup_counts': every step of every request, summed) and MoE-Infinity's activation-matrix
    collection (one matrix per request) read, as the real systems profile on a dataset before serving."""

    def __post_init__(self):
        super().__post_init__()
        if self.warmup_steps < 0:
            raise MoespacError(f"warmup_steps {self.warmup_steps} must be >= 0")


def spec_named(name: str) -> ModelSpec:
    """A registry name, or a local model folder (its config.json, read by transformers)."""
    folder = Path(name)
    if (folder / "config.json").is_file():
        from transformers import AutoConfig

        from moespac.models.specs import spec_from_config

        return spec_from_config(AutoConfig.from_pretrained(folder), name=str(folder))
    return get_spec(name)


def resolve_spec(name: str, trace: Trace) -> ModelSpec:
    if name != "trace":
        return spec_named(name)
    spec = trace.meta.get("model_spec")
    if not isinstance(spec, dict):
        raise MoespacError(f"trace {trace.trace_id() or '?'}: meta 'model_spec' is not a model spec; "
                           "name one with --model-spec")
    try:
        return ModelSpec.from_dict(spec)
    except MoespacError as e:
        raise MoespacError(f"trace {trace.trace_id() or '?'}: its model_spec is incomplete ({e}); "
                           "name one with --model-spec") from None


def resolve_draft(name: str | None, trace: Trace) -> tuple[ModelSpec | None, str]:
    """(draft spec, where it came from)."""
    if name:
        return spec_named(name), "given"
    if not (trace.steps["step_gamma"] > 0).any():
        return None, "none (no drafted steps)"
    if isinstance(trace.meta.get("draft_spec"), dict):
        return ModelSpec.from_dict(trace.meta["draft_spec"]), "trace"
    folder = trace.meta.get("draft")  # the engine records the draft's folder or hub id
    if isinstance(folder, str) and (Path(folder) / "config.json").is_file():
        return spec_named(folder), f"trace's draft folder {folder}"
    return get_spec(DEFAULT_DRAFT), f"default ({DEFAULT_DRAFT}, the paper's draft)"


def policy_costs(workload, cost: CostModel) -> UnitCosts:
    """UnitCosts for cost-aware policies: one expert at the routing batch of a step (batch x (gamma + 1))."""
    batch = int(workload.trace.meta.get("batch_size", 1) or 1)
    tokens = batch * (int(workload.steps["step_gamma"].max(initial=0)) + 1)
    return cost.unit_costs(tokens=tokens, batch=batch)


def run_policy(workload, timing, costs: UnitCosts, policy_spec: str, capacity: int,
               per_layer_capacity: int | None = None, warm_cache: bool = False, warmup_counts=None, history=None):
    """Replay one policy; returns (policy, ReplayResult)."""
    policy = make_policy(policy_spec)
    result = replay(workload, timing, policy, capacity, per_layer_capacity=per_layer_capacity, costs=costs,
                    warm_cache=warm_cache, warmup_counts=warmup_counts, history=history)
    return policy, result


def profile_history(paths, spec, allow_topology_mismatch: bool, topology) -> tuple[np.ndarray, list[str]]:
    """([R, L, E] activation counts of every request of the traces at `paths`, mapped onto `spec` as the
    replayed trace is; their trace ids). A trace of another model's shape is refused: its experts are others."""
    history, ids = [], []
    for path in paths:
        t = load_trace(path)
        if t.topology != topology:  # another model's routing names other experts
            raise MoespacError(f"profile trace {path}: topology {t.topology} differs from the replayed trace's "
                               f"{topology}")
        w = make_workload(t, spec, allow_topology_mismatch, trace_path=path)
        history += [w.counts[steps].sum(axis=0, dtype=np.int64) for steps in w.requests()]
        ids.append(t.trace_id())
    return np.stack(history), ids


def simulate(cfg: SimConfig, trace: Trace | None = None) -> dict:
    """Run the simulation described by `cfg`; returns the result record."""
    trace = trace if trace is not None else load_trace(cfg.trace)
    profile = load_profile(cfg.hardware)
    spec = resolve_spec(cfg.model_spec, trace)
    draft, draft_source = resolve_draft(cfg.draft_spec, trace)
    workload = make_workload(trace, spec, cfg.allow_topology_mismatch, trace_path=cfg.trace)
    cost = CostModel(profile, spec, draft, cfg.expert_dtype)
    timing = cost.timing(workload)
    total = workload.topology.num_layers * workload.topology.num_experts
    fit = cost.fit_slots()
    capacity = cfg.requested_slots(total, cost.expert_bytes)  # as the engine sizes it
    capacity = min(fit, total) if capacity is None else capacity
    name, options = parse_policy(cfg.policy)
    unit = policy_costs(workload, cost)
    warm, window, history, profiled = None, None, None, []
    if cfg.profile_traces:
        history, profiled = profile_history(cfg.profile_traces, spec, cfg.allow_topology_mismatch, trace.topology)
        warm = history.sum(axis=0)
        window = dict(source="every step of the requests of other prompts (not replayed): " + ", ".join(profiled),
                      requests=len(history), steps=None, entries=int(warm.sum()))
    elif cfg.warmup_steps:
        warm, window = warmup_window(workload.counts, workload.steps["step_request"], cfg.warmup_steps)
        window = dict(window, source="first steps of the trace's first request (also replayed)")
    per_layer = cfg.per_layer_capacity(capacity, workload.topology.num_layers)
    policy, result = run_policy(workload, timing, unit, cfg.policy, capacity, per_layer, cfg.warm_cache, warm,
                                history)
    metrics = result.summary()
    extra = {}
    if cfg.bounds:
        bound = infinite_cache(workload, timing)
        oracle_m = None
        if not cfg.warm_cache:  # the oracle reads each request's future: cold requests only
            same = name == "oracle" and not options  # the oracle's own cell: its replay is the bound's
            oracle_m = (metrics if same
                        else run_policy(workload, timing, unit, "oracle", capacity, per_layer)[1].summary())
            oracle_m = {k: oracle_m[k] for k in ("tokens_per_s", "decode_s", "prefill_s", "latency_s", "hit_rate",
                                                 "host_share", "link_bytes")}
        extra["bounds"] = {"infinite_cache": bound, "oracle": oracle_m}
        tps = metrics["tokens_per_s"]
        extra["distance"] = {  # share of the bound's throughput the policy reaches (1 = matches it)
            "of_infinite_cache": tps / bound["tokens_per_s"] if bound["tokens_per_s"] else None,
            "of_oracle": tps / oracle_m["tokens_per_s"] if oracle_m and oracle_m["tokens_per_s"] else None}
    config = dict(trace_id=trace.trace_id(), policy=name, policy_options=options, hardware=profile.name,
                  hardware_sha256=profile.sha256, model_spec=spec.name, draft_spec=draft.name if draft else None,
                  cache_slots=capacity, per_layer=cfg.per_layer, expert_dtype=cost.expert_dtype,
                  allow_topology_mismatch=cfg.allow_topology_mismatch, warm_cache=cfg.warm_cache,
                  warmup_steps=cfg.warmup_steps, profile_traces=profiled)
    return make_record(
        "simulate", "simulated", config, metrics,
        profile={"name": profile.name, "sha256": profile.sha256, "path": profile.path,
                 "device_is_host": profile.device_is_host},
        trace={"id": trace.trace_id(), "path": str(Path(cfg.trace)) if cfg.trace else None,
               "model": (trace.meta.get("model_spec", {}).get("name")
                         if isinstance(trace.meta.get("model_spec"), dict) else None),
               "steps": trace.num_steps, "requests": len(result.requests)},
        model_spec=spec.name, draft={"spec": draft.name if draft else None, "source": draft_source},
        topology_mapping=workload.mapping,
        policy={"name": name, "options": options, "stats": policy.describe()},
        cache={"slots": capacity, "ratio": capacity / total if total else 0.0, "fit_slots": fit,
               "bytes": capacity * cost.expert_bytes, "fits_device_memory": capacity <= fit,
               "expert_bytes": cost.expert_bytes},
        unit_costs=unit.__dict__, warmup_window=window, requests=result.requests, **extra)
