"""What-if: the Table 1 methods' simulated throughput against how local the routing is.

MoE-SpAc's lookahead pays off only if the experts one verify step activates are few and recur in the next
steps. A router trained for minutes (the proxy pair) activates nearly as many distinct experts per step as a
uniform one, so the proxy's traces say little about a trained 30B router. This replays synthetic traces of the
model spec's shape (moespac/sim/synthetic.py: a fixed per-layer popularity of swept `skew` plus a drifting
part) through each method on one hardware profile, and places recorded traces on the same axis: distinct
experts per layer in a decode step. Every number is simulated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from moespac.errors import MoespacError, check_unit_interval
from moespac.routing import decode_counts, locality
from moespac.models.specs import get_spec
from moespac.policy import Topology, check_signals
from moespac.record import make_record
from moespac.registry import make_policy
from moespac.sim.replay import SIM_SIGNALS
from moespac.sim.simulate import SimConfig, simulate
from moespac.sim.synthetic import synthetic_trace
from moespac.catalogue import get_method


@dataclass(frozen=True)
class LocalitySweep:
    """What to sweep and where to simulate it."""

    skews: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
    """Popularity skews of the synthetic traces (0 = uniform routing)."""
    methods: tuple[str, ...] = ("moespac", "hybrimoe", "llamacpp", "llamacpp-sd", "mixtral-offload", "moe-infinity")
    """Study methods (moespac/catalogue.py); each runs with a draft or autoregressively as in Table 1."""
    hardware: str = "rtx4090-pcie4"
    """Hardware profile name or YAML path."""
    model_spec: str = "qwen3-30b-a3b"
    """Model whose shape the synthetic traces take and whose expert sizes are simulated."""
    draft_spec: str = "qwen3-4b-fp8"
    """Draft whose cost the speculative methods are charged."""
    cache_ratio: float = 0.25
    """Device expert slots / all experts."""
    tokens: int = 256
    """New tokens of each synthetic trace."""
    gamma: int = 8
    """Draft tokens per verify step of the synthetic speculative traces."""
    persistence: float = 0.9
    """Step-to-step correlation of the drifting part of the synthetic popularity."""
    accept: float = 0.8
    """Per-token draft acceptance of the synthetic speculative steps (the same for every skew)."""
    allow_topology_mismatch: bool = False
    """Map recorded traces of another topology onto the model spec by modulo (recorded in their rows)."""

    def __post_init__(self):
        def bad(key, why):
            raise MoespacError(f"locality sweep key {key!r}={getattr(self, key)!r}: {why}")

        if not self.skews or any(s < 0 for s in self.skews):
            bad("skews", "one or more skews >= 0")
        if not self.methods:
            bad("methods", "at least one method")
        for m in self.methods:
            get_method(m)  # names the unknown method
        check_unit_interval("locality sweep key 'cache_ratio'", self.cache_ratio)
        if self.tokens < 1 or self.gamma < 1:
            bad("tokens" if self.tokens < 1 else "gamma", "must be >= 1")
        if not 0 <= self.persistence < 1:
            bad("persistence", "must lie in [0, 1)")
        if not 0 <= self.accept <= 1:
            bad("accept", "must lie in [0, 1]")


def distinct_per_step(trace) -> float:
    """Mean distinct experts per layer in a decode step (proxy-stats' active share x experts)."""
    return locality(decode_counts(trace))[1] * trace.topology.num_experts


def _methods_on(cfg: LocalitySweep, sd, ar, label: str, skipped: dict) -> dict[str, dict]:
    """method -> simulated metrics on one pair of traces; a method the trace lacks a signal for (Fate's
    cross-layer top-k on a synthetic trace) is left out, its reason kept in `skipped`."""
    out = {}
    for slug in cfg.methods:
        m = get_method(slug)
        trace = sd if m.draft else ar
        try:
            check_signals(make_policy(m.policy), trace.signals() | SIM_SIGNALS | {"warmup_counts"})
        except MoespacError as e:
            skipped.setdefault(slug, str(e))
            continue
        sim = SimConfig(trace=label, policy=m.policy, hardware=cfg.hardware, model_spec=cfg.model_spec,
                        draft_spec=cfg.draft_spec, cache_ratio=cfg.cache_ratio, bounds=False,
                        allow_topology_mismatch=cfg.allow_topology_mismatch)
        rec = simulate(sim, trace=trace)
        out[slug] = dict({k: rec["metrics"][k] for k in ("tokens_per_s", "hit_rate", "host_share", "link_utilisation",
                                                         "decode_s")},
                         breakdown_decode_s=rec["metrics"]["breakdown_decode_s"],
                         profile_sha256=rec["profile"]["sha256"])
    return out


def run_locality_sweep(cfg: LocalitySweep, recorded: tuple | None = None, progress=None) -> dict:
    """The sweep's record (timing: simulated). recorded: optional (label, SD trace, AR trace) placed on the
    same axis. progress: an optional callable(iterable, total) -> iterable, e.g. tqdm."""
    spec = get_spec(cfg.model_spec)
    topo = Topology(spec.num_moe_layers, spec.num_experts, spec.top_k)
    cases = [(f"synthetic skew {s:g}", s) for s in cfg.skews] + ([(recorded[0], None)] if recorded else [])
    rows, skipped = [], {}
    for label, skew in (progress(cases, len(cases)) if progress else cases):
        if skew is None:
            sd, ar = recorded[1], recorded[2]
        else:
            kw = dict(new_tokens=cfg.tokens, skew=skew, persistence=cfg.persistence, accept=cfg.accept,
                      model_spec=spec, seed=0)
            sd, ar = synthetic_trace(topo, gamma=cfg.gamma, **kw), synthetic_trace(topo, gamma=0, **kw)
        rows.append(dict(trace=label, skew=skew, recorded=skew is None, sd_trace=sd.trace_id(), ar_trace=ar.trace_id(),
                         distinct=distinct_per_step(sd), methods=_methods_on(cfg, sd, ar, label, skipped)))
    uniform = topo.num_experts * (1 - (1 - topo.top_k / topo.num_experts) ** (cfg.gamma + 1))
    metrics = dict(uniform_distinct=uniform, rows=rows, skipped=skipped)
    return make_record("whatif-locality", "simulated", dataclasses.asdict(cfg), metrics)


def ratio_to_best_other(row: dict, method: str = "moespac") -> float | None:
    """method's tokens/s over the best other method's in one row (None if either is missing)."""
    m = row["methods"]
    others = [v["tokens_per_s"] for k, v in m.items() if k != method]
    if method not in m or not others or max(others) <= 0:
        return None
    return m[method]["tokens_per_s"] / max(others)
