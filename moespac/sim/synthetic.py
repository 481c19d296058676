"""Synthetic activation traces with temporal locality (tests and the replay-speed benchmark), and small
random scenarios with their costs (the bounds' property tests and benchmarks/oracle_gap.py).

Not a model of any real router: each layer has a fixed expert popularity (normal logits of scale
`skew`) plus a drifting AR(1) part (correlation `persistence` from one step to the next); each token
takes the top-k of Gumbel-perturbed logits. Speculative steps draft `gamma` tokens and accept each in
turn with probability `accept`, so a step emits 1..gamma+1 tokens.
"""

from __future__ import annotations

import numpy as np

from moespac.models.specs import ModelSpec
from moespac.policy import Topology
from moespac.sim.cost import Timing
from moespac.sim.workload import Workload, make_workload
from moespac.trace import KINDS, SCHEMA_VERSION, Trace


def _routing(rng, base, drift, tokens: int, top_k: int) -> np.ndarray:
    """int16 [tokens, L, k] top-k of base + drift + Gumbel noise."""
    logits = base + drift + rng.gumbel(size=(tokens,) + base.shape).astype(np.float32)
    return np.argpartition(-logits, top_k - 1, axis=-1)[..., :top_k].astype(np.int16)


def synthetic_trace(topology: Topology, new_tokens: int = 512, gamma: int = 8, prompt_tokens: int = 64,
                    accept: float = 0.7, requests: int = 1, skew: float = 1.5, persistence: float = 0.9,
                    seed: int = 0, model_spec: ModelSpec | None = None) -> Trace:
    """A trace of `requests` requests, each a prefill then decode steps until `new_tokens` are emitted
    (verify steps of gamma + 1 tokens when gamma > 0, else one-token AR steps)."""
    rng = np.random.default_rng(seed)
    L, E, k = topology.num_layers, topology.num_experts, topology.top_k
    rows = {name: [] for name in ("step_kind", "step_request", "step_tokens", "step_gamma", "step_accepted",
                                  "step_emitted")}
    ids = []
    rho, scale = persistence, np.float32(np.sqrt(1 - persistence**2))
    for r in range(requests):
        base = rng.normal(0, skew, (L, E)).astype(np.float32)
        drift = rng.normal(0, skew, (L, E)).astype(np.float32)
        emitted = 0
        while emitted < new_tokens:
            if emitted == 0:
                kind, n, g, acc, out = "prefill", prompt_tokens, 0, 0, 1
            elif gamma > 0:
                accepted = rng.random(gamma) < accept
                acc = int(np.argmin(accepted)) if not accepted.all() else gamma
                kind, n, g, out = "verify", gamma + 1, gamma, min(acc + 1, new_tokens - emitted)
            else:
                kind, n, g, acc, out = "ar", 1, 0, 0, 1
            drift = rho * drift + scale * rng.normal(0, skew, (L, E)).astype(np.float32)
            ids.append(_routing(rng, base, drift, n, k))
            for name, v in (("step_kind", KINDS.index(kind)), ("step_request", r), ("step_tokens", n),
                            ("step_gamma", g), ("step_accepted", acc), ("step_emitted", out)):
                rows[name].append(v)
            emitted += out
    steps = {name: np.asarray(v) for name, v in rows.items()}
    steps["step_kind"] = steps["step_kind"].astype(np.int8)
    steps["step_request"] = steps["step_request"].astype(np.int32)
    steps["step_tokens"] = steps["step_tokens"].astype(np.int32)
    steps["step_gamma"] = steps["step_gamma"].astype(np.int16)
    steps["step_accepted"] = steps["step_accepted"].astype(np.int16)
    steps["step_emitted"] = steps["step_emitted"].astype(np.int32)
    topk = np.concatenate(ids) if ids else np.zeros((0, L, k), np.int16)
    spec = model_spec.to_dict() if model_spec is not None else {"name": "synthetic"}
    meta = dict(schema_version=SCHEMA_VERSION, topology=dict(num_layers=L, num_experts=E, top_k=k),
                model_spec=spec, trace_id=f"synthetic-{L}x{E}-k{k}-g{gamma}-n{new_tokens}-s{seed}", batch_size=1,
                synthetic=dict(accept=accept, skew=skew, persistence=persistence, seed=seed))
    return Trace(meta=meta, steps=steps, topk_ids=topk,
                 topk_weights=np.full(topk.shape, 1.0 / k, np.float16)).validate("synthetic trace")


def toy_spec(topology: Topology, hidden: int = 8, expert_ffn: int = 8) -> ModelSpec:
    """A tiny MoE ModelSpec with the given expert topology (for hand-made traces and tests)."""
    return ModelSpec(name=f"toy-{topology.num_layers}x{topology.num_experts}-k{topology.top_k}", hub_id=None,
                     num_layers=topology.num_layers, num_moe_layers=topology.num_layers,
                     num_experts=topology.num_experts, num_shared_experts=0, top_k=topology.top_k,
                     hidden_size=hidden, expert_ffn=expert_ffn, num_attention_heads=1, num_kv_heads=1,
                     head_dim=hidden, vocab_size=16, source="toy")


def hand_trace(topology: Topology, steps: list[tuple[str, int, int, list]], trace_id: str = "hand",
               request_of_step: list[int] | None = None) -> Trace:
    """A trace from explicit routing: steps = [(kind, gamma, emitted, ids)] with ids[token][layer] = the
    token's top-k experts at that layer. Built through TraceRecorder, as the engine builds its traces."""
    from moespac.trace import TraceRecorder

    rec = TraceRecorder(topology, toy_spec(topology).to_dict(), cross_layer=False)
    for s, (kind, gamma, emitted, ids) in enumerate(steps):
        ids = np.asarray(ids, dtype=np.int16).reshape(len(ids), topology.num_layers, topology.top_k)
        rec.begin(kind, request_of_step[s] if request_of_step else 0, len(ids), gamma)
        for layer in range(topology.num_layers):
            rec.layer(layer, ids[:, layer], np.full(ids[:, layer].shape, 1.0 / topology.top_k), None)
        rec.end(min(emitted - 1, gamma) if kind == "verify" else 0, emitted)
    return rec.finish(trace_id=trace_id)


def toy_scenario(rng: np.random.Generator, L: int, E: int, k: int, n_steps: int, requests: int, gamma: int,
                 d0: float, d1: float, h0: float, h1: float, load: float, serial: bool) -> tuple[Workload, Timing]:
    """A small random workload and its costs: `requests` requests of `n_steps` steps (a one-token prefill,
    then verify steps of gamma + 1 tokens, or AR steps), uniformly random top-k routing, fixed costs per step
    uniform in [0, 1), expert time affine in the routing count c (device d0 + 0.2 d1 c, host h0 + h1 c)."""
    steps, request_of_step = [], []
    for r in range(requests):
        for s in range(n_steps):
            tokens = 1 if s == 0 or gamma == 0 else gamma + 1
            kind = "prefill" if s == 0 else ("verify" if gamma else "ar")
            ids = [[rng.permutation(E)[:k].tolist() for _ in range(L)] for _ in range(tokens)]
            steps.append((kind, gamma if kind == "verify" else 0, 1, ids))
            request_of_step.append(r)
    topo = Topology(L, E, k)
    workload = make_workload(hand_trace(topo, steps, request_of_step=request_of_step), toy_spec(topo))
    S = len(steps)
    c = np.arange(int(workload.counts.max()) + 1)
    timing = Timing(draft=rng.uniform(0, 1, S) * (workload.steps["step_gamma"] > 0), attention=rng.uniform(0, 1, S),
                    other=rng.uniform(0, 1, S), device_by_count=np.where(c > 0, d0 + 0.2 * d1 * c, 0.0),
                    host_by_count=np.where(c > 0, h0 + h1 * c, 0.0), hidden=rng.uniform(0, 1, S),
                    load=load, expert_bytes=1, serial=serial)
    return workload, timing


def random_toy_scenario(seed: int) -> tuple[Workload, Timing, int]:
    """toy_scenario with every parameter drawn from `seed`, over the property tests' ranges; + a capacity."""
    rng = np.random.default_rng(seed)
    L, E = int(rng.integers(1, 4)), int(rng.integers(2, 6))
    k = int(rng.integers(1, min(2, E) + 1))
    n_steps, requests, gamma = int(rng.integers(1, 6)), int(rng.integers(1, 3)), int(rng.integers(0, 3))
    d0, d1, h0, h1 = rng.uniform(0.05, 3.0, 4)
    load, serial, capacity = float(rng.uniform(0.05, 8.0)), bool(rng.integers(0, 2)), int(rng.integers(0, L * E + 1))
    workload, timing = toy_scenario(rng, L, E, k, n_steps, requests, gamma, d0, d1, h0, h1, load, serial)
    timing.device_call = float(rng.uniform(0.0, 1.0))  # drawn last: the draws above keep their values
    return workload, timing, capacity
