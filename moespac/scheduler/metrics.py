"""Scheduler metrics from activation traces (pure numpy): the paper's Fig. 4, App. A.1, B.1 and C.2 figures.

Every function takes a moespac.trace.Trace or activation counts int [S, L, E] (one row per target forward,
counts = (token, top-k slot) entries naming each expert).
"""

from __future__ import annotations

import numpy as np

from moespac.cache import CacheCounters
from moespac.errors import MoespacError
from moespac.scheduler.config import MoESpAcConfig
from moespac.scheduler.estimator import UtilityEstimator
from moespac.trace import KINDS, Trace


def omega(gamma: int, alpha: float | None) -> float | None:
    """Expected tokens per verify step from the per-token acceptance rate alpha (paper Eq. 1; Leviathan et al.
    2023): (1 - a^(g+1)) / (1 - a), g + 1 at a = 1; None without an acceptance rate or a draft (gamma 0)."""
    if alpha is None or gamma < 1:
        return None
    return float(gamma + 1) if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def step_counts(trace: Trace, kinds=("verify", "ar"), accepted_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Counts [S', L, E] and tokens [S'] of the trace's steps of `kinds` (prefill is left out by default).

    accepted_only keeps, in verify steps, the first accepted + 1 tokens (the previous step's token and
    the accepted drafts); it needs batch size 1, because the trace sums acceptances over the batch.
    """
    if accepted_only and int(trace.meta.get("batch_size", 1)) != 1:
        raise MoespacError("accepted-only counts need a batch-size-1 trace (step_accepted is summed over the batch)")
    L, E = trace.topology.num_layers, trace.topology.num_experts
    if not accepted_only:  # whole steps: the trace's own counts
        keep = np.isin(trace.steps["step_kind"], [KINDS.index(k) for k in kinds])
        return trace.counts()[keep].copy(), trace.steps["step_tokens"][keep].astype(np.int64)
    rows, tokens = [], []
    for s in range(trace.num_steps):
        if trace.kind(s) not in kinds:
            continue
        ids = trace.step_ids(s).astype(np.int64)
        if accepted_only and trace.kind(s) == "verify":
            ids = ids[:int(trace.steps["step_accepted"][s]) + 1]
        flat = (ids + np.arange(L)[None, :, None] * E).ravel()
        rows.append(np.bincount(flat, minlength=L * E).reshape(L, E))
        tokens.append(len(ids))
    counts = np.stack(rows).astype(np.int32) if rows else np.zeros((0, L, E), np.int32)
    return counts, np.asarray(tokens, dtype=np.int64)


def _counts(source) -> np.ndarray:
    counts = step_counts(source)[0] if isinstance(source, Trace) else np.asarray(source)
    if counts.ndim != 3:
        raise MoespacError(f"activation counts must be [steps, layers, experts], got shape {counts.shape}")
    return counts


def hot_cold_accuracy(source, config: MoESpAcConfig | None = None, gamma: int | None = None, tau: int = 1) -> dict:
    """Online hot/cold prediction accuracy (paper Fig. 4, tau = 1, averaged over layers).

    Per step: predicted hot = u >= tau before the step, actual hot = activated in the step; accuracy =
    share of experts classified correctly, the paper's measure (Fig. 4 calls it accuracy, its text "precision").
    With 8 of 128 experts active, calling every expert cold already scores 0.94, so the class-aware figures come
    with it, over all (step, layer, expert) entries: precision and recall of "hot" and balanced accuracy (the mean
    of the hot and the cold recall; 0.5 for any constant guess). The estimator runs with `config` (default: the
    paper variant); gamma defaults to the trace's draft length, else 8.
    """
    counts = _counts(source)
    cfg = (config or MoESpAcConfig()).resolved()
    if gamma is None:
        gamma = int(source.steps["step_gamma"].max()) if isinstance(source, Trace) and source.num_steps else 8
    S, L, E = counts.shape
    freq = counts
    if cfg.decoding == "ar":  # f = counts summed over the last ar_window steps
        c = np.cumsum(counts, 0, dtype=np.int64)
        freq = c - np.concatenate([np.zeros((cfg.ar_window, L, E), np.int64), c[:-cfg.ar_window]])[:S]
        gamma = cfg.ar_window - 1
    est = UtilityEstimator.from_config(cfg, L, E, gamma)

    def steps():
        for s in range(S):
            yield est.u >= tau, counts[s] > 0
            est.update(freq[s])

    return _scores(steps(), L)


def previous_step_accuracy(source) -> dict:
    """The same scores for an AR, layer-level predictor: hot = activated at the previous step (Fig. 4's baseline)."""
    counts = _counts(source)
    prev = np.concatenate([np.zeros_like(counts[:1], dtype=bool), counts[:-1] > 0])
    return _scores(zip(prev, counts > 0), counts.shape[1])


def _scores(steps, layers: int) -> dict:
    """Accuracy per step and layer, and precision, recall and balanced accuracy of 'hot' over all entries, from
    (predicted hot, activated) [layers, experts] pairs, one per step."""
    correct, tally = [], np.zeros(4, np.int64)  # true hot, false hot, false cold, true cold
    for pred, hot in steps:
        correct.append((pred == hot).mean(1))
        tally += [(pred & hot).sum(), (pred & ~hot).sum(), (~pred & hot).sum(), (~pred & ~hot).sum()]
    correct = np.array(correct).reshape(-1, layers)
    tp, fp, fn, tn = (float(x) for x in tally)
    ratio = lambda a, b: a / b if b else float("nan")  # noqa: E731
    recall, cold_recall = ratio(tp, tp + fn), ratio(tn, tn + fp)
    return dict(accuracy=float(correct.mean()) if len(correct) else float("nan"), per_step=correct.mean(1),
                per_layer=correct.mean(0), precision=ratio(tp, tp + fp), recall=recall,
                balanced_accuracy=(recall + cold_recall) / 2)


def smape(source, include_idle: bool = True) -> float:
    """Mean sMAPE of consecutive frequencies, 2|f_t - f_{t-1}| / (f_t + f_{t-1}) (paper App. B.1).

    Pairs where both frequencies are zero score 0, as the paper assigns; include_idle=False leaves them
    out of the mean instead.
    """
    f = _counts(source).astype(np.float64)
    prev, cur = f[:-1], f[1:]
    den = prev + cur
    val = np.divide(2 * np.abs(cur - prev), den, out=np.zeros_like(den), where=den > 0)
    if not include_idle:
        val = val[den > 0]
    return float(val.mean()) if val.size else float("nan")


def expert_cost_ratio(source, top_k: int | None = None, tokens: np.ndarray | None = None) -> dict:
    """Expert cost ratio a/b of App. A.1 (T_SD = a N (...) L + gamma T_D, T_AR = b N (...) L gamma).

    a N = distinct experts a verify step touches in a layer, b N = those one AR token touches (top_k),
    so a/b = mean distinct experts per (step, layer) / top_k; SD pays off when a/b < Omega. Read this way
    a/b >= 1, while the paper reports 0.23-0.76, so `per_token` also gives the distinct experts per
    (token, slot) entry, distinct / (tokens * top_k), which does lie in (0, 1].
    """
    counts = _counts(source)
    if isinstance(source, Trace):
        top_k = top_k or source.topology.top_k
        if tokens is None:
            tokens = step_counts(source)[1]
    if top_k is None:
        raise MoespacError("expert_cost_ratio needs top_k for plain count arrays")
    distinct = (counts > 0).sum(-1)  # [S, L]
    tokens = counts.sum(-1)[:, 0] / top_k if tokens is None else np.asarray(tokens, dtype=np.float64)
    return dict(a_over_b=float(distinct.mean() / top_k),
                per_token=float(distinct.sum() / (counts.shape[1] * top_k * tokens.sum())),
                distinct_mean=float(distinct.mean()))


def cache_summary(counters: CacheCounters | dict) -> dict:
    """GPU expert-cache hit rate and the share of activated experts computed on the CPU (App. C.2)."""
    d = counters.to_dict() if isinstance(counters, CacheCounters) else dict(counters)
    n = d["hits"] + d["loads"] + d["host"]
    return dict(activations=n, hit_rate=d["hits"] / n if n else 0.0, cpu_share=d["host"] / n if n else 0.0)
