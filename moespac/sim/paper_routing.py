"""Paper-regime routing: synthetic activation traces at a target model's own topology (Qwen3-30B-A3B: 48 MoE
layers x 128 experts, top-8) whose statistics are fitted to what the paper reports about its routing, never
to a throughput.

The router model, per request (all draws from one seeded generator):
- popularity: each layer has static expert logits ~ N(0, skew^2) (assumed, `skew`);
- persistence: a drifting part, AR(1) with correlation `persistence` from one decode step to the next and
  the same stationary spread, so the hot set moves slowly (fitted to the paper's sMAPE, App. B.1);
- cross-layer correlation: a token that ran expert e at layer l adds `coupling` to expert pi_l(e)'s logit at
  layer l + 1 (pi_l a fixed random permutation), as adjacent layers' gate inputs are alike; the trace's
  `cross_topk` (layer l + 1's router on layer l's input, what FATE and SpecExp read) is the top-k of layer
  l + 1's logits without the token's own noise, so the prediction exists and is right as often as the
  routing is predictable;
- tokens of one step: top-k of the step's logits plus `temperature` x Gumbel noise per token; a low
  temperature makes the gamma + 1 tokens of a verify step share experts (a/b of App. A.1, fitted per
  benchmark);
- drafts: accepted in turn with probability `accept` until the first rejection (alpha of App. A.1);
- the self-draft signal (MoE-SpeQ's INT4 self-draft routing the drafted tokens, read by MoE-SpeQ and SP-MoE):
  each drafted token's top-k with each entry kept with probability `SELF_DRAFT_FIDELITY` and otherwise swapped
  for an expert outside the token's top-k (assumed: MoE-SpeQ reports 90.9 % fidelity for its INT4 self-draft
  on its own models, arXiv 2511.14102; drawn from a generator of its own, so the routing is unchanged).

A verify step's rows 0..emitted-1 are tokens the output keeps; the AR trace of the same request replays exactly
those rows as one-token steps (as moespac.ar_trace derives an AR trace from a recorded one).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from moespac.errors import MoespacError
from moespac.models.specs import ModelSpec
from moespac.trace import KINDS, SCHEMA_VERSION, Trace

SOURCE = "synthetic, fitted to the paper's App. A.1 and B.1 routing statistics"
BENCHMARK_ORDER = ("mmlu-pro", "mt-bench", "gsm8k", "humaneval", "alpaca", "cnn-dm", "qa")
"""Each benchmark's traces draw from their own seed (seed + 1000 x this index): benchmarks that share fitted
parameters still get their own requests."""


@dataclass(frozen=True)
class RoutingParams:
    """One benchmark's routing, as the generator takes it."""

    accept: float
    """Per-draft acceptance probability (the paper's alpha, App. A.1)."""
    temperature: float = 1.0
    """Spread of the tokens of one step around the step's logits (fitted to a/b, App. A.1)."""
    persistence: float = 0.9
    """Step-to-step correlation of the drifting logits (fitted to sMAPE, App. B.1)."""
    skew: float = 1.5
    """Spread of the static per-layer expert popularity (assumed: the paper reports no concentration figure)."""
    coupling: float = 1.0
    """Logit added at layer l + 1 to the expert a token's layer-l experts lead to (assumed; makes cross-layer
    predictions mean something)."""

    def __post_init__(self):
        for key, lo, hi in (("accept", 0.0, 1.0), ("temperature", 1e-3, 100.0), ("persistence", 0.0, 0.9999),
                            ("skew", 0.0, 100.0), ("coupling", 0.0, 100.0)):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and lo <= v <= hi):
                raise MoespacError(f"routing parameter {key} = {v!r} outside [{lo}, {hi}]")


@dataclass(frozen=True)
class Shape:
    """What a trace holds: its requests and their lengths (the study's, so replays compare like for like)."""

    requests: int = 4
    new_tokens: int = 256
    prompt_tokens: int = 64
    gamma: int = 8
    batch: int = 1
    """Sequences per request (one engine call): their steps run together, each sequence leaving when done."""


GOLDEN = 0.6180339887498949
SELF_DRAFT_FIDELITY = 0.909
"""Share of the self-draft's top-k entries that match the full-precision router's (assumed: the fidelity
MoE-SpeQ reports for its own INT4 self-draft, arXiv 2511.14102; not a statistic of the MoE-SpAc paper)."""


def self_draft_rows(rng, ids: np.ndarray, num_experts: int, fidelity: float) -> np.ndarray:
    """The self-draft's routing of a verify step's drafted rows (ids [gamma + 1, L, k]; the bonus row, which no
    draft produced, is -1): each entry kept with probability `fidelity`, else another expert not in that row."""
    out = ids.copy()
    out[-1] = -1
    n, L, k = ids.shape
    swap = rng.random((n - 1, L, k)) >= fidelity
    t, layer, j = np.nonzero(swap)
    taken = np.sort(ids[t, layer], axis=1)  # each swapped entry's row, ascending
    if k >= num_experts or (taken[:, 1:] == taken[:, :-1]).any():  # a row with no other expert, or a repeated one
        for t, layer, j in zip(t, layer, j):
            rest = np.setdiff1d(np.arange(num_experts), ids[t, layer])
            if len(rest):
                out[t, layer, j] = rest[int(rng.integers(len(rest)))]
        return out
    # the pick-th expert outside the row, for every swapped entry at once (one draw each, in the same order: the
    # generator's integers(m) one at a time and size=count give the same numbers)
    pick = rng.integers(num_experts - k, size=len(t))
    for i in range(k):  # step over the row's experts at or below the pick, in ascending order
        pick = pick + (taken[:, i] <= pick)
    out[t, layer, j] = pick
    return out


def accepted_drafts(u: float, accept: float, gamma: int) -> int:
    """Drafts accepted before the first rejection, each accepted with probability `accept`, from one uniform u in
    (0, 1]: P(at least i) = accept^i, so i = floor(log u / log accept), capped at gamma (inverse CDF)."""
    if accept <= 0.0:
        return 0
    if accept >= 1.0:
        return gamma
    return min(gamma, int(np.floor(np.log(u) / np.log(accept))))


def _topk(logits: np.ndarray, k: int) -> np.ndarray:
    return np.argpartition(-logits, k - 1, axis=-1)[..., :k]


def _request(rng, spec: ModelSpec, p: RoutingParams, shape: Shape, perms: np.ndarray, sd_rng, self_draft: bool = True):
    """(rows [n, L, k], cross [n, L, k], self-draft [n, L, k], steps [(kind, tokens, gamma, accepted, emitted)])
    of one request."""
    L, E, k, g = spec.num_moe_layers, spec.num_experts, spec.top_k, shape.gamma
    base = rng.normal(0.0, p.skew, (L, E)).astype(np.float32)
    drift = rng.normal(0.0, p.skew, (L, E)).astype(np.float32)
    innov = np.float32(np.sqrt(1.0 - p.persistence ** 2))
    logits, noise, steps, emitted = [], [], [], 0
    u = rng.random()  # acceptance draws: a golden-ratio sequence from here, so few requests already hold alpha
    while emitted < shape.new_tokens:  # every draw first, in the generator's order
        if emitted == 0:
            kind, n, gam, acc, out = "prefill", shape.prompt_tokens, 0, 0, 1
        else:
            u = (u + GOLDEN) % 1.0
            acc = accepted_drafts(1.0 - u, p.accept, g)
            kind, n, gam, out = "verify", g + 1, g, min(acc + 1, shape.new_tokens - emitted)
            drift = p.persistence * drift + innov * rng.normal(0.0, p.skew, (L, E)).astype(np.float32)
        logits.append(base + drift)  # [L, E]
        noise.append((p.temperature * rng.gumbel(size=(n, L, E))).astype(np.float32))
        steps.append((kind, n, gam, acc, out))
        emitted += out
    # then every token of every step at once, layer by layer (a token's routing reads only its step's logits,
    # its own noise and its layer below)
    sizes = [st[1] for st in steps]
    of_row = np.repeat(np.arange(len(steps)), sizes)
    logits, noise = np.stack(logits), np.concatenate(noise)
    n = len(of_row)
    ids = np.empty((n, L, k), np.int64)
    pred = np.full((n, L, k), -1, np.int64)
    lead = np.zeros((n, E), np.float32)  # the coupling term from the layer below
    for layer in range(L):
        ids[:, layer] = _topk(logits[of_row, layer] + lead + noise[:, layer], k)
        lead = np.zeros((n, E), np.float32)
        if layer + 1 < L:
            np.put_along_axis(lead, perms[layer][ids[:, layer]], p.coupling, axis=1)
            pred[:, layer] = _topk(logits[of_row, layer + 1] + lead, k)  # layer l + 1's router on layer l's input
    starts = np.cumsum([0] + sizes)
    drafted = [np.full_like(ids[a:b], -1) if kind == "prefill" or not self_draft
               else self_draft_rows(sd_rng, ids[a:b], E, SELF_DRAFT_FIDELITY)
               for (kind, *_), a, b in zip(steps, starts[:-1], starts[1:])]
    return ids, pred, np.concatenate(drafted), steps


def _batched(seqs: list[tuple]) -> tuple:
    """One request of several sequences (each _request's output): step i runs the i-th step of every sequence
    that still has one (their rows one after another; accepted drafts and new tokens summed), as a batch whose
    finished sequences leave."""
    starts = [np.cumsum([0] + [st[1] for st in steps]) for *_, steps in seqs]
    rows, cross, drafted, steps = [], [], [], []
    for i in range(max(len(q[3]) for q in seqs)):
        live = [j for j, q in enumerate(seqs) if i < len(q[3])]
        for out, part in ((rows, 0), (cross, 1), (drafted, 2)):
            out.append(np.concatenate([seqs[j][part][starts[j][i]:starts[j][i + 1]] for j in live]))
        kind, _, gam, _, _ = seqs[live[0]][3][i]
        steps.append((kind, sum(seqs[j][3][i][1] for j in live), gam, sum(seqs[j][3][i][3] for j in live),
                      sum(seqs[j][3][i][4] for j in live)))
    return np.concatenate(rows), np.concatenate(cross), np.concatenate(drafted), steps


class Sequences:
    """The seeded draws a trace is built from: the model's wiring, then one sequence (one prompt's request) after
    another, generated when first asked for and kept. Traces built from one Sequences draw them once: the SD trace
    and its AR twin, and Table 4's traces of every batch size (request r of batch b holds sequences r*b .. r*b+b-1).
    Sequence i is the same whoever asks first, so each such trace equals the one drawn on its own."""

    def __init__(self, spec: ModelSpec, params: RoutingParams, shape: Shape, seed: int = 0, self_draft: bool = True):
        if not spec.is_moe:
            raise MoespacError(f"model spec {spec.name!r} is dense: no experts to route")
        self.spec, self.params, self.shape, self.seed, self.self_draft = spec, params, shape, seed, self_draft
        self.rng = np.random.default_rng(seed)
        # the model's wiring: shared by its requests
        self.perms = np.stack([self.rng.permutation(spec.num_experts) for _ in range(spec.num_moe_layers)])
        self.sd_rng = np.random.default_rng([seed, 1])  # its own stream: the routing draws stay as they were
        self._done: list[tuple] = []

    def fits(self, spec: ModelSpec, params: RoutingParams, shape: Shape, seed: int, self_draft: bool) -> bool:
        """Whether these are the draws of a trace of these arguments (any batch size and request count)."""
        per_sequence = lambda sh: (sh.new_tokens, sh.prompt_tokens, sh.gamma)
        return (spec == self.spec and params == self.params and per_sequence(shape) == per_sequence(self.shape)
                and seed == self.seed and self_draft == self.self_draft)

    def __getitem__(self, i: int) -> tuple:
        while len(self._done) <= i:  # int16 ids, as the trace stores them (-1 .. num_experts - 1)
            rows, cross, drafted, steps = _request(self.rng, self.spec, self.params, self.shape, self.perms,
                                                   self.sd_rng, self.self_draft)
            self._done.append((rows.astype(np.int16), cross.astype(np.int16), drafted.astype(np.int16), steps))
        return self._done[i]


def paper_regime_trace(spec: ModelSpec, params: RoutingParams, shape: Shape = Shape(), seed: int = 0,
                       benchmark: str = "synthetic", ar: bool = False, self_draft: bool = True,
                       sequences: Sequences | None = None) -> Trace:
    """A speculative trace at `spec`'s own depth (ar=True: the AR trace of the same kept tokens; self_draft=False:
    without the self-draft signal, which only MoE-SpeQ and SP-MoE read and which costs most of the generation).
    sequences: draws shared with other traces of the same arguments (Sequences), else its own."""
    if sequences is None:
        sequences = Sequences(spec, params, shape, seed, self_draft)
    elif not sequences.fits(spec, params, shape, seed, self_draft):
        raise MoespacError("paper-regime trace: the shared sequences were drawn for other arguments")
    L, E, k = spec.num_moe_layers, spec.num_experts, spec.top_k
    cols = {c: [] for c in ("step_kind", "step_request", "step_tokens", "step_gamma", "step_accepted",
                            "step_emitted")}
    ids_out, cross_out, sd_out = [], [], []
    if shape.batch > 1 and ar:
        raise MoespacError("paper-regime traces: an autoregressive trace is batch 1 (Table 4 replays SD only)")
    for r in range(shape.requests):
        if shape.batch > 1:
            rows, cross, drafted, steps = _batched([sequences[r * shape.batch + j] for j in range(shape.batch)])
        else:
            rows, cross, drafted, steps = sequences[r]
        start = 0
        for kind, n, gam, acc, out in steps:
            keep = range(start, start + (n if (kind == "prefill" or not ar) else out))
            if ar and kind == "verify":  # each kept token is one AR step: rows 0..emitted-1 of the verify step
                for i in keep:
                    ids_out.append(rows[i:i + 1])
                    cross_out.append(cross[i:i + 1])
                    for c, v in zip(cols, (KINDS.index("ar"), r, 1, 0, 0, 1)):
                        cols[c].append(v)
            else:
                ids_out.append(rows[start:start + n])
                cross_out.append(cross[start:start + n])
                sd_out.append(drafted[start:start + n])
                for c, v in zip(cols, (KINDS.index(kind), r, n, gam, acc, out)):
                    cols[c].append(v)
            start += n
    dtypes = dict(step_kind=np.int8, step_request=np.int32, step_tokens=np.int32, step_gamma=np.int16,
                  step_accepted=np.int16, step_emitted=np.int32)
    steps = {c: np.asarray(v, dtype=dtypes[c]) for c, v in cols.items()}
    topk = np.concatenate(ids_out).astype(np.int16)
    mode = ("ar" if ar else f"g{shape.gamma}") + (f"-b{shape.batch}" if shape.batch > 1 else "")
    meta = dict(schema_version=SCHEMA_VERSION, topology=dict(num_layers=L, num_experts=E, top_k=k),
                model_spec=spec.to_dict(), batch_size=shape.batch, source=SOURCE,
                trace_id=f"paper-regime-{spec.name}-{benchmark}-{mode}-s{seed}",
                synthetic=dict(dataclasses.asdict(params), **dataclasses.asdict(shape), seed=seed, benchmark=benchmark,
                               ar=ar, source=SOURCE,
                               self_draft_fidelity=None if ar or not self_draft else SELF_DRAFT_FIDELITY))
    return Trace(meta=meta, steps=steps, topk_ids=topk, topk_weights=np.full(topk.shape, 1.0 / k, np.float16),
                 cross_topk=np.concatenate(cross_out).astype(np.int16),
                 self_draft_topk=None if ar or not self_draft else np.concatenate(sd_out).astype(np.int16),
                 ).validate("paper-regime trace")


def trace_name(benchmark: str, gamma: int, ar: bool = False) -> str:
    """The file name of a benchmark's paper-regime trace (speculative at `gamma`, or its autoregressive twin), as
    `moespac fit-routing --traces` and `moespac report paper-regime --traces` write it."""
    return f"{benchmark}-ar.npz" if ar else f"{benchmark}-g{gamma}.npz"


def measured_statistics(trace: Trace) -> dict:
    """alpha, a/b and sMAPE of a trace, as the fit reads them: alpha = accepted / (accepted + rejected drafts)
    over verify steps; a/b = distinct experts of a verify step's layer / ((gamma + 1) k), mean over (step,
    layer), App. A.1's per-token ratio; sMAPE as moespac.scheduler.metrics computes it for records."""
    from moespac.scheduler.metrics import smape

    st = trace.steps
    verify = st["step_kind"] == KINDS.index("verify")
    if not verify.any():
        raise MoespacError(f"trace {trace.trace_id()}: no verify steps to measure alpha and a/b on")
    acc = st["step_accepted"][verify].astype(np.int64)
    rejected = (acc < st["step_gamma"][verify]).sum()
    counts = trace.counts()[verify]  # [S, L, E]
    distinct = (counts > 0).sum(-1)  # [S, L]
    per_token = distinct / (st["step_tokens"][verify][:, None] * trace.topology.top_k)
    return dict(alpha=float(acc.sum() / (acc.sum() + rejected)), a_over_b=float(per_token.mean()),
                smape=smape(trace))


# ---- the fit --------------------------------------------------------------------------------------------

ROUTING_QUANTITIES = {"acceptance_rate": "alpha", "expert_cost_ratio_a_over_b": "a_over_b"}
"""The only rows of moespac/reference the fit reads, besides sMAPE (App. B.1): statistics of the routing, never a
throughput (tests/test_paper_regime.py poisons every other row and finds the same fit)."""
FIT_SHAPE = Shape(requests=1, new_tokens=96)  # what each step of the search generates (common random numbers)
T_RANGE = (0.01, 50.0)
RHO_RANGE = (0.0, 0.999)


def paper_targets() -> tuple[dict[str, dict[str, float]], float]:
    """({benchmark: {alpha, a_over_b}} of App. A.1, sMAPE of Qwen3-30B in App. B.1)."""
    from moespac.datasets import get_benchmark
    from moespac.reference import read_reference

    targets: dict[str, dict[str, float]] = {}
    for row in read_reference("appendix_stats"):
        key = ROUTING_QUANTITIES.get(row["quantity"])
        if key is not None:
            targets.setdefault(get_benchmark(row["context"]).name, {})[key] = float(row["value"])
    smape = next(float(r["value"]) for r in read_reference("appendix_stats")
                 if r["quantity"] == "smape" and r["context"] == "Qwen3-30B")
    return targets, smape


def _bisect(f, lo: float, hi: float, target: float, increasing: bool, steps: int, log: bool = False) -> float:
    """x in [lo, hi] with f(x) nearest `target` for a monotone f (geometric midpoints when log)."""
    for _ in range(steps):
        mid = float(np.sqrt(lo * hi)) if log else (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return float(np.sqrt(lo * hi)) if log else (lo + hi) / 2


def fit_routing(spec: ModelSpec, targets: dict[str, dict[str, float]], smape_target: float, gamma: int = 8,
                seed: int = 0, rounds: int = 2, log=lambda msg: None) -> tuple[dict[str, RoutingParams], str]:
    """Per benchmark: accept = alpha; temperature fitted to a/b; one persistence for all fitted to the mean sMAPE.
    Returns (parameters, a note on sMAPE). An alpha or a/b no parameter can produce is refused, naming it. sMAPE
    (per decode step, as App. B.1 defines it) is mostly set by a/b: a step whose gamma + 1 tokens touch many
    distinct experts counts most of them once, so where the target lies outside what persistence can reach, the
    nearest end is kept and the note says so (the residual is printed beside the fit)."""
    shape = dataclasses.replace(FIT_SHAPE, gamma=gamma)

    def stat(params: RoutingParams, key: str) -> float:  # the self-draft signal is no routing statistic: not drawn
        return measured_statistics(paper_regime_trace(spec, params, shape, seed=seed, self_draft=False))[key]

    lowest, highest = 1.0 / (gamma + 1), 1.0
    for bench, t in sorted(targets.items()):
        if not 0.0 < t["alpha"] < 1.0:
            raise MoespacError(f"{bench}: acceptance {t['alpha']} is not in (0, 1)")
        if not lowest < t["a_over_b"] < highest:
            raise MoespacError(f"{bench}: a/b {t['a_over_b']} cannot be routed at gamma {gamma}: a verify step's "
                               f"distinct experts per token lie in ({lowest:.3f}, 1)")
    rho, temps = 0.9, {b: 1.0 for b in targets}
    for r in range(rounds):
        for bench, t in sorted(targets.items()):
            base = RoutingParams(accept=t["alpha"], persistence=rho)
            temps[bench] = _bisect(lambda x: stat(dataclasses.replace(base, temperature=x), "a_over_b"), *T_RANGE,
                                   t["a_over_b"], increasing=True, steps=14, log=True)

        def mean_smape(x: float) -> float:
            return float(np.mean([stat(RoutingParams(accept=t["alpha"], temperature=temps[b], persistence=x), "smape")
                                  for b, t in sorted(targets.items())]))

        ends = mean_smape(RHO_RANGE[0]), mean_smape(RHO_RANGE[1])  # sMAPE falls as persistence grows
        if ends[1] <= smape_target <= ends[0]:
            rho, note = _bisect(mean_smape, *RHO_RANGE, smape_target, increasing=False, steps=10), ""
        else:
            rho = RHO_RANGE[1] if smape_target < ends[1] else RHO_RANGE[0]
            note = (f"sMAPE {smape_target} (App. B.1) is out of reach at these a/b: persistence "
                    f"{RHO_RANGE[0]}-{RHO_RANGE[1]} gives a mean of {ends[1]:.3f}-{ends[0]:.3f}; the nearest end, "
                    f"{rho}, is kept")
        log(f"round {r + 1}: persistence {rho:.4f}, temperatures " +
            ", ".join(f"{b} {temps[b]:.3f}" for b in sorted(temps)))
    return {b: RoutingParams(accept=t["alpha"], temperature=temps[b], persistence=rho)
            for b, t in sorted(targets.items())}, note


def fill_missing(fitted: dict[str, RoutingParams], benchmarks: list[str]) -> tuple[dict[str, RoutingParams], str]:
    """Benchmarks the paper gives no statistics for take the mean of the fitted ones' parameters (said so)."""
    mean = RoutingParams(accept=float(np.mean([p.accept for p in fitted.values()])),
                         temperature=float(np.exp(np.mean([np.log(p.temperature) for p in fitted.values()]))),
                         persistence=next(iter(fitted.values())).persistence)
    out = {b: fitted.get(b, mean) for b in benchmarks}
    filled = sorted(b for b in benchmarks if b not in fitted)
    rule = (f"{', '.join(filled)}: no App. A.1 statistics; the mean of the fitted benchmarks' parameters (alpha "
            f"{mean.accept:.3f}, temperature {mean.temperature:.3f}, geometric mean)") if filled else ""
    return out, rule
