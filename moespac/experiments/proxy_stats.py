"""Does the proxy pair behave like the paper's models? Speculative decoding (greedy by default) over each
benchmark's offline prompts through the real engine, with an activation trace, then: acceptance rate, expert popularity
(share of activations taken by the top 10 % of experts), temporal locality (sMAPE, step-to-step expert
reuse) and MoE-SpAc's hot/cold prediction accuracy, next to the paper's numbers. All measured on the proxy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from moespac.errors import MoespacError
from moespac.routing import decode_counts, locality, top_share


@dataclass
class BenchStats:
    """One benchmark's figures (measured on the proxy pair)."""

    benchmark: str
    label: str
    prompts: int
    skipped: int
    prompt_tokens_mean: float
    new_tokens: int
    drafted: int
    accepted: int
    verify_steps: int
    alpha: float
    """Per-token acceptance rate, the paper's alpha (its token yield is Omega(gamma, alpha) = (1 - alpha^(gamma+1)) /
    (1 - alpha)): accepted / (accepted + rejected) draft tokens, a step ending at its first rejection."""
    accepted_share: float
    """Accepted / drafted tokens (drafts after a step's first rejection count as not accepted)."""
    tokens_per_step: float
    """Mean tokens a verify step yields (accepted + 1): the measured Omega."""
    top10_share: float
    """Share of (token, slot) routing entries in decode steps taken by the top 10 % of a layer's experts, mean
    over layers."""
    top10_uniform: float
    """What top10_share would be under uniform routing."""
    reuse: float
    """Share of a layer's experts active in a decode step that were also active in the step before."""
    active_share: float
    """Share of a layer's experts active in a decode step (what `reuse` would be without temporal locality)."""
    smape: float | None
    hot_cold_accuracy: float | None
    hot_cold_balanced: float | None
    """Balanced accuracy of the same prediction (mean of the hot and the cold recall): 0.5 for a constant guess."""
    paper_alpha: float | None


def paper_reference() -> dict:
    """The paper's figures these stats compare with (moespac/reference/appendix_stats.csv)."""
    from moespac.datasets import get_benchmark
    from moespac.reference import appendix_value, read_reference

    alpha = {get_benchmark(r["context"]).name: float(r["value"])
             for r in read_reference("appendix_stats") if r["quantity"] == "acceptance_rate"}
    return dict(alpha=alpha, smape=appendix_value("smape", "Qwen3-30B"),
                hot_cold_accuracy=appendix_value("hot_cold_accuracy"))


def scheduler_metrics(per_request: list[np.ndarray], gamma: int) -> tuple[float | None, float | None, float | None]:
    """sMAPE, hot/cold accuracy and its balanced accuracy from moespac.scheduler.metrics (None where it is not
    installed), per request (the scheduler starts afresh with each request), weighted by decode steps."""
    try:
        from moespac.scheduler import metrics
    except ImportError:
        return None, None, None
    rows = [c for c in per_request if len(c) >= 2]
    if not rows:
        return None, None, None
    w = np.array([len(c) for c in rows], dtype=float)
    sm = np.array([metrics.smape(c) for c in rows])
    hc = [metrics.hot_cold_accuracy(c, gamma=gamma) for c in rows]
    mean = lambda key: float((np.array([h[key] for h in hc]) * w).sum() / w.sum())
    return float((sm * w).sum() / w.sum()), mean("accuracy"), mean("balanced_accuracy")


def run(pair: str | Path, benchmarks: list[str], prompts: int = 10, max_new_tokens: int = 128, gamma: int = 8,
        seed: int = 0, temperature: float = 0.0, trace_dir: str | Path | None = None,
        progress=None) -> list[BenchStats]:
    """Speculative decoding of `prompts` prompts per benchmark, greedy (temperature 0) or sampled with exact
    speculative sampling; fixed length (EOS is ignored)."""
    from moespac.datasets import encode_prompts, get_benchmark, load_benchmark, seeded_sample
    from moespac.engine.session import EngineConfig, EngineSession
    from moespac.engine.speculative import Sampling
    from moespac.models.loading import load_pair
    from moespac.models.specs import spec_from_config

    pair = Path(pair)
    if not (pair / "target").is_dir() or not (pair / "draft").is_dir():
        raise MoespacError(f"--pair {pair}: expected {pair}/target and {pair}/draft (see `moespac build-proxy`)")
    if gamma < 1 or prompts < 1 or max_new_tokens < 1:
        raise MoespacError(f"gamma ({gamma}), prompts ({prompts}) and max new tokens ({max_new_tokens}) must be >= 1")
    benches = [get_benchmark(b) for b in benchmarks]
    target, draft, tok = load_pair(str(pair / "target"), str(pair / "draft"), dtype="fp32")
    spec = spec_from_config(target.config, name=f"proxy:{pair.name}")
    ref = paper_reference()
    sampling = Sampling(temperature=temperature, seed=seed)
    # routing and tokens do not depend on the cache (the split never changes the numbers); sync copies anyway
    session = EngineSession(target, draft, tok, EngineConfig(target=str(pair / "target"), policy="lru",
                                                             cache_ratio=0.5, copy_mode="sync"))
    out = []
    try:
        for bench in benches:
            chosen = seeded_sample(load_benchmark(bench.name), prompts, seed)
            enc = encode_prompts(chosen, tok, max_context=target.config.max_position_embeddings,
                                 max_new_tokens=max_new_tokens + gamma + 1)
            session.record(spec.to_dict(), meta=dict(
                target=str(pair / "target"), draft=str(pair / "draft"), gamma=gamma, batch_size=1, policy="lru",
                cache_ratio=0.5, benchmark=bench.name, proxy=True))
            drafted = accepted = new = steps = rejected = 0
            for i, (_, ids) in enumerate(enc.items):
                (res,), _ = session.generate([ids], gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling,
                                             request=i, ignore_eos=True)
                drafted, accepted, new = drafted + res.drafted, accepted + res.accepted, new + len(res.tokens)
                steps, rejected = steps + len(res.accepted_per_step), rejected + res.rejected
                if progress:
                    progress()
            trace = session.finish_trace(trace_id=f"proxy-stats-{bench.name}")
            if trace_dir:
                trace.save(Path(trace_dir) / f"{bench.name}.npz")
            per_request = decode_counts(trace)
            total = sum(c.sum(0) for c in per_request) if per_request else np.zeros((1, 1))
            reuse, active = locality(per_request)
            sm, acc, balanced = scheduler_metrics(per_request, gamma)
            label = chosen[0].label if chosen else bench.display
            out.append(BenchStats(
                bench.name, label, len(enc.items), len(enc.skipped),
                float(np.mean([len(ids) for _, ids in enc.items])) if enc.items else float("nan"), new, drafted,
                accepted, steps, accepted / (accepted + rejected) if accepted + rejected else float("nan"),
                accepted / drafted if drafted else float("nan"), (accepted + steps) / steps if steps else float("nan"),
                float(np.nanmean(top_share(total))),
                math.ceil(0.1 * session.topology.num_experts) / session.topology.num_experts, reuse, active, sm, acc,
                balanced, ref["alpha"].get(bench.name)))
    finally:
        session.close()
    return out


def render(rows: list[BenchStats], pair, gamma: int, prompts: int, max_new_tokens: int,
           temperature: float = 0.0) -> str:
    ref = paper_reference()
    fmt = lambda v, d=3: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{d}f}"  # noqa: E731
    mode = "greedy" if temperature == 0 else f"sampled at temperature {temperature}"
    head = (f"proxy-stats: measured on the pair {pair} (a local pair, not Qwen3-30B-A3B); {mode} speculative "
            f"decoding, gamma {gamma}, up to {prompts} prompts x {max_new_tokens} new tokens per benchmark "
            f"(EOS ignored)")
    cols = ("benchmark", "prompts", "alpha", "paper alpha", "accepted/drafted", "tokens/step", "top-10% share", "reuse",
            "active", "sMAPE", "hot/cold acc", "balanced")
    table = [cols]
    for r in rows:
        table.append((r.label, str(r.prompts), fmt(r.alpha), fmt(r.paper_alpha, 2), fmt(r.accepted_share),
                      fmt(r.tokens_per_step, 2), fmt(r.top10_share), fmt(r.reuse), fmt(r.active_share), fmt(r.smape),
                      fmt(r.hot_cold_accuracy), fmt(r.hot_cold_balanced)))
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = [head, ""] + ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                          for row in table]
    in_range = sum(0.4 <= r.alpha <= 0.9 for r in rows if not math.isnan(r.alpha))
    lines += ["",
              "alpha: per-token acceptance rate as in the paper's token yield "
              "Omega(gamma, alpha) = (1 - alpha^(gamma+1)) / "
              "(1 - alpha), estimated as accepted / (accepted + rejected) drafts; accepted/drafted also counts the "
              "drafts after a step's first rejection; tokens/step = accepted + 1 per verify step",
              f"alpha in [0.4, 0.9] on {in_range} of {len(rows)} benchmarks (paper, Qwen3-30B-A3B + Qwen3-4B-FP8: "
              f"{min(ref['alpha'].values()):.2f}-{max(ref['alpha'].values()):.2f} on CNN/DM, MT-Bench, GSM8K, "
              f"HumanEval)",
              f"top-10% share: uniform routing would give {rows[0].top10_uniform:.3f}; reuse vs active: share of a "
              f"step's experts also active in the step before vs the share active (equal without temporal locality)",
              f"paper: sMAPE {fmt(ref['smape'])} (Qwen3-30B, App. B.1), "
              f"hot/cold accuracy ~{fmt(ref['hot_cold_accuracy'], 2)} "
              f"(Sec. 4.3, the share of experts classified correctly); balanced: mean of the hot and the cold recall "
              f"(a constant guess scores 0.5, while calling every expert cold scores 1 - k/E on plain accuracy; the "
              f"paper gives none); '-' = not available"]
    return "\n".join(lines)


def to_dicts(rows: list[BenchStats]) -> list[dict]:
    return [asdict(r) for r in rows]
