"""The Table 1 methods on paper-regime routing: what the paper's own routing statistics say about its headline.

The proxy pairs route almost uniformly (a/b 0.60-0.66 against the paper's 0.23-0.76), so their traces answer
"what happens on a near-uniform router". This study replays synthetic traces at Qwen3-30B-A3B's own depth whose
alpha and a/b are fitted per benchmark to App. A.1 (moespac/sim/paper_routing.py) through every Table 1 method
on one hardware profile, beside the paper's own Table 1 number. No throughput of any method is read by the fit;
the paper's numbers are shown beside, never used. Every number here is simulated.

With `infer_host`, every method is also replayed on the host inferred from the paper's own llama.cpp rows
(moespac/sim/infer_host.py: the host bandwidth at which llama.cpp gives the paper's tokens/s, per benchmark),
beside the sourced profile whose host is an assumption; the headline methods are also replayed at the lowest
and highest per-benchmark fit, the range the inference leaves open. With `sweep`, the headline and every lossless
method are replayed with one host parameter at a time moved across its physically plausible range
(infer_host.PLAUSIBLE), on the benchmarks with App. A.1 statistics: where, if anywhere, does the headline hold?
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moespac.catalogue import get_method
from moespac.datasets import get_benchmark
from moespac.errors import MoespacError, check_unit_interval
from moespac.models.specs import get_spec
from moespac.parallel import pmap
from moespac.policy import check_signals
from moespac.record import make_record
from moespac.registry import make_policy
from moespac.sim import paper_routing as pr
from moespac.sim.infer_host import PLAUSIBLE, ab_from_sd_gain, infer_host, with_host_bandwidth, with_parameter
from moespac.sim.profile import profile_yaml
from moespac.sim.replay import SIM_SIGNALS
from moespac.sim.simulate import SimConfig, simulate


BRACKETED = ("moespac", "llamacpp-sd", "hybrimoe")
"""Methods also replayed at the lowest and highest per-benchmark host fit: the headline's two sides and the best
lossless baseline of the sourced run."""
REFERENCE = ("oracle-sd",)
"""Bounds, not methods: never 'the best other method'."""
FITTED_ROW = "llamacpp"
"""The catalogue method of the paper's row the host is fitted to (infer_host.PAPER_ROWS)."""


@dataclass(frozen=True)
class PaperRegimeStudy:
    """Which methods, benchmarks and hardware the paper-regime traces are replayed on."""

    methods: tuple[str, ...]
    """Study methods (moespac/catalogue.py), each with its draft or autoregressively as in Table 1."""
    benchmarks: tuple[str, ...]
    """Benchmarks; those without App. A.1 statistics take the fitted ones' mean parameters (said so)."""
    hardware: str = "rtx4090-pcie4"
    """Hardware profile name or YAML path."""
    model_spec: str = "qwen3-30b-a3b"
    """The model whose depth the traces take and whose expert sizes are simulated."""
    draft_spec: str = "qwen3-4b-fp8"
    """The draft whose cost the speculative methods are charged."""
    cache_ratio: float = 0.25
    """Device expert slots / all experts."""
    gamma: int = 8
    """Draft length of the speculative traces (a/b is fitted at it)."""
    requests: int = 4
    """Requests per trace."""
    new_tokens: int = 256
    """New tokens per request."""
    seed: int = 0
    """Seed of the fit and of every trace."""
    infer_host: bool = True
    """Also replay every method on the host inferred from the paper's llama.cpp rows (its own profile)."""
    sweep: bool = True
    """With infer_host: also move each host parameter across its plausible range (infer_host.PLAUSIBLE) and
    replay the headline and every lossless method there."""
    table2_methods: tuple[str, ...] = ()
    """Table 2's variants (ablations), replayed on the inferred host (the sourced one without infer_host)."""
    table2_benchmarks: tuple[str, ...] = ()
    """The benchmarks of those replays (Table 2's own)."""
    table4_benchmark: str = ""
    """Table 4's benchmark: MoE-SpAc replayed over the grid below on batched traces of its routing ('' = none)."""
    table4_batch_sizes: tuple[int, ...] = ()
    """Table 4's batch sizes (sequences per engine call)."""
    table4_gammas: tuple[int, ...] = ()
    """Table 4's draft lengths (the routing fitted at `gamma` is kept; alpha and a/b at other lengths follow)."""

    def __post_init__(self):
        if not self.methods or not self.benchmarks:
            raise MoespacError("paper-regime study: give at least one method and one benchmark")
        for m in self.methods + self.table2_methods:
            get_method(m)
        for b in self.benchmarks + self.table2_benchmarks:
            get_benchmark(b)
        if self.table4_benchmark and self.table4_benchmark not in self.benchmarks:
            raise MoespacError(f"paper-regime study: table4 benchmark {self.table4_benchmark!r} "
                               "is not a study benchmark")
        if any(v < 1 for v in self.table4_batch_sizes + self.table4_gammas):
            raise MoespacError("paper-regime study: table4 batch sizes and gammas >= 1")
        if set(self.table2_benchmarks) - set(self.benchmarks):
            raise MoespacError(f"paper-regime study: table2 benchmark "
                               f"{sorted(set(self.table2_benchmarks) - set(self.benchmarks))[0]!r} "
                               "is not a study benchmark")
        check_unit_interval("paper-regime study cache_ratio", self.cache_ratio)
        if self.gamma < 1 or self.requests < 1 or self.new_tokens < 2:
            raise MoespacError("paper-regime study: gamma and requests >= 1, new_tokens >= 2")


def run_study(cfg: PaperRegimeStudy, progress=None, traces_dir: str | Path | None = None, jobs: int = 1) -> dict:
    """The study's record (timing: simulated): the fit with its residuals, and per benchmark every method's
    simulated tokens/s and hit rate. progress: an optional callable(iterable, total, what) -> iterable. traces_dir:
    also write every benchmark's two traces there (pr.trace_name), once the study has run. jobs: processes the
    independent replays and fits are spread over (the record is the same for any number)."""
    spec = get_spec(cfg.model_spec)
    targets, smape_target = pr.paper_targets()
    fitted, smape_note = pr.fit_routing(spec, targets, smape_target, gamma=cfg.gamma, seed=cfg.seed)
    params, fill_rule = pr.fill_missing(fitted, list(cfg.benchmarks))
    shape = pr.Shape(requests=cfg.requests, new_tokens=cfg.new_tokens, gamma=cfg.gamma)
    rows, skipped = [], {}
    benches = list(cfg.benchmarks)
    seeds = {bench: cfg.seed + 1000 * (list(pr.BENCHMARK_ORDER).index(bench) if bench in pr.BENCHMARK_ORDER else i)
             for i, bench in enumerate(benches)}

    def draw(bench: str) -> tuple:
        drawn = pr.Sequences(spec, params[bench], shape, seed=seeds[bench])  # one draw for the SD and AR traces
        return tuple(pr.paper_regime_trace(spec, params[bench], shape, seed=seeds[bench], benchmark=bench, ar=ar,
                                           sequences=drawn) for ar in (False, True))

    traces = dict(zip(benches, pmap(draw, benches, jobs, progress, "traces")))
    with tempfile.TemporaryDirectory() as tmp:
        inferred, hosts = None, {"sourced": cfg.hardware}
        if cfg.infer_host:
            inferred = infer_host(cfg.hardware, {b: t[1] for b, t in traces.items()}, cfg.cache_ratio,
                                  cfg.draft_spec, Path(tmp), jobs=jobs)
            profile = inferred.pop("profile")
            inferred["profile_yaml"] = profile_yaml(profile)
            for key, bw in (("inferred", inferred["value"]), ("inferred_low", inferred["low"]),
                            ("inferred_high", inferred["high"])):
                path = Path(tmp) / f"{key}.yaml"
                path.write_text(profile_yaml(with_host_bandwidth(profile, bw, profile.sources["host_mem_bandwidth"])))
                hosts[key] = str(path)
            # do the paper's tables agree? the a/b llama.cpp's SD gain implies on that host, beside A.1's
            inferred["ab_from_sd_gain"] = ab_from_sd_gain(spec, {b: params[b] for b in benches if b in fitted},
                                                          hosts["inferred"], cfg.cache_ratio, cfg.draft_spec,
                                                          pr.FIT_SHAPE, seed=cfg.seed, jobs=jobs)
        replayable = []
        for slug in dict.fromkeys(cfg.methods + cfg.table2_methods):
            m = get_method(slug)
            try:
                check_signals(make_policy(m.policy), traces[benches[0]][0 if m.draft else 1].signals() | SIM_SIGNALS
                              | {"warmup_counts"})
                replayable.append(slug)
            except MoespacError as e:  # a signal the synthetic traces do not carry
                skipped[slug] = str(e)

        def replay_one(slug: str, bench: str, hardware: str) -> dict:
            m = get_method(slug)
            trace = traces[bench][0 if m.draft else 1]
            sim = SimConfig(trace=trace.trace_id(), policy=m.policy, hardware=hardware, model_spec="trace",
                            draft_spec=cfg.draft_spec, cache_ratio=cfg.cache_ratio, bounds=False)
            rec = simulate(sim, trace=trace)  # once: a comprehension over it would replay per key
            return dict({k: rec["metrics"][k] for k in ("tokens_per_s", "latency_s", "hit_rate", "host_share")},
                        per_request={k: [r[k] for r in rec["requests"]] for k in ("tokens_per_s", "latency_s")})

        replay = Replays(replay_one, jobs, progress)
        primary = "inferred" if "inferred" in hosts else "sourced"  # where Table 2's variants are replayed
        in_table1 = [s for s in replayable if s in cfg.methods]
        on_host = {key: [s for s in in_table1 if not key.startswith("inferred_") or s in BRACKETED] for key in hosts}
        replay.fill([(slug, bench, hosts[key]) for bench in benches for key in hosts for slug in on_host[key]]
                    + [(slug, bench, hosts[primary]) for bench in cfg.table2_benchmarks
                       for slug in cfg.table2_methods if slug in replayable], "replays")

        for bench in benches:
            sd, ar = traces[bench]
            methods = {key: {slug: replay(slug, bench, hardware) for slug in on_host[key]}
                       for key, hardware in hosts.items()}
            table2 = {} if bench not in cfg.table2_benchmarks else {
                slug: methods[primary].get(slug) or replay(slug, bench, hosts[primary])
                for slug in cfg.table2_methods if slug in replayable}
            rows.append(dict(benchmark=bench, params=dataclasses.asdict(params[bench]), filled=bench not in fitted,
                             target=targets.get(bench, {}), measured=pr.measured_statistics(sd),
                             sd_trace=sd.trace_id(), ar_trace=ar.trace_id(), methods=methods.pop("sourced"),
                             **{f"methods_{k}": v for k, v in methods.items()}, table2=table2, table2_host=primary))
        table4 = None
        if cfg.table4_benchmark and cfg.table4_batch_sizes and cfg.table4_gammas:
            table4 = dict(benchmark=cfg.table4_benchmark, host=primary,
                          cells=batch_grid(cfg, spec, params[cfg.table4_benchmark], seeds[cfg.table4_benchmark],
                                           hosts[primary], progress, jobs))
        if inferred is not None and cfg.sweep:
            swept = [b for b in benches if b in fitted]
            pool = contenders({r["benchmark"]: r["methods_inferred"] for r in rows if r["benchmark"] in swept})
            inferred["sweep"] = host_sweep(profile, pool, swept, replay, Path(tmp))
            inferred["sweep_pool_rule"] = CONTENDER_RULE
    if traces_dir is not None:
        for bench, (sd, ar) in traces.items():
            sd.save(Path(traces_dir) / pr.trace_name(bench, cfg.gamma))
            ar.save(Path(traces_dir) / pr.trace_name(bench, cfg.gamma, ar=True))
    sd_note = (f"MoE-SpeQ and SP-MoE read a synthetic self-draft signal: each drafted token's top-k entry kept with "
               f"probability {pr.SELF_DRAFT_FIDELITY} (assumed: the fidelity MoE-SpeQ reports for its own INT4 "
               f"self-draft, not a statistic of this paper), else another expert")
    metrics = dict(rows=rows, skipped=skipped, smape_target=smape_target, smape_note=smape_note, fill_rule=fill_rule,
                   self_draft_note=sd_note, inferred_host=inferred, table4=table4,
                   source=pr.SOURCE, reads=sorted(pr.ROUTING_QUANTITIES) + ["smape"])
    return make_record("paper-regime", "simulated", dataclasses.asdict(cfg), metrics)


def batch_grid(cfg: PaperRegimeStudy, spec, params, seed: int, hardware: str, progress=None,
               jobs: int = 1) -> list[dict]:
    """Table 4 on paper-regime routing: MoE-SpAc on batched traces of one benchmark's routing at every batch size x
    draft length; tokens/s of all sequences together (aggregate) and per sequence (aggregate / batch size, as each
    sequence runs for its whole call), with the per-call samples of the aggregate."""
    m = get_method("moespac")

    def column(g: int) -> list[dict]:
        # one draft length's batch sizes in order, so that they share one draw of the sequences (pr.Sequences)
        out, drawn = [], None
        for b in cfg.table4_batch_sizes:
            shape = pr.Shape(requests=cfg.requests, new_tokens=cfg.new_tokens, gamma=g, batch=b)
            if drawn is None or not drawn.fits(spec, params, shape, seed, self_draft=False):
                drawn = pr.Sequences(spec, params, shape, seed=seed, self_draft=False)  # MoE-SpAc does not read it
            trace = pr.paper_regime_trace(spec, params, shape, seed=seed, benchmark=cfg.table4_benchmark,
                                          self_draft=False, sequences=drawn)
            sim = SimConfig(trace=trace.trace_id(), policy=m.policy, hardware=hardware, model_spec="trace",
                            draft_spec=cfg.draft_spec, cache_ratio=cfg.cache_ratio, bounds=False)
            rec = simulate(sim, trace=trace)
            agg = rec["metrics"]["tokens_per_s"]
            out.append(dict(batch_size=b, gamma=g, trace=trace.trace_id(), tokens_per_s=agg / b,
                            aggregate_tokens_per_s=agg, latency_s=rec["metrics"]["latency_s"],
                            hit_rate=rec["metrics"]["hit_rate"],
                            per_request={"aggregate_tokens_per_s": [r["tokens_per_s"] for r in rec["requests"]],
                                         "latency_s": [r["latency_s"] for r in rec["requests"]]},
                            measured=pr.measured_statistics(trace) if b == 1 else None))
        return out

    cells = {(c["batch_size"], c["gamma"]): c for col in pmap(column, cfg.table4_gammas, jobs, progress,
                                                               "table 4 draft lengths") for c in col}
    return [cells[b, g] for b in cfg.table4_batch_sizes for g in cfg.table4_gammas]


class Replays:
    """The study's replays, each (method, benchmark, hardware) run once: `fill` runs a batch of them over `jobs`
    processes, a call returns one (running it if no batch held it)."""

    def __init__(self, replay_one, jobs: int = 1, progress=None):
        self.replay_one, self.jobs, self.progress = replay_one, jobs, progress
        self.done: dict[tuple, dict] = {}

    def fill(self, keys, what: str = "replays") -> None:
        todo = [k for k in dict.fromkeys(keys) if k not in self.done]
        self.done.update(zip(todo, pmap(lambda k: self.replay_one(*k), todo, self.jobs, self.progress, what)))

    def __call__(self, slug: str, bench: str, hardware: str) -> dict:
        key = (slug, bench, hardware)
        if key not in self.done:
            self.fill([key])
        return self.done[key]


CONTENDER_RULE = ("replayed at each point (MoE-SpAc, llama.cpp-w/ SD, llama.cpp (the row the host is fitted to: how "
                  "far each parameter moves it says whether the paper's rows pin that parameter down), and every "
                  "lossless method within 2x of the best lossless one on some swept benchmark at the inferred host; "
                  "the rest are left out to keep the job short)")


def contenders(on_inferred: dict[str, dict[str, dict]], factor: float = 2.0) -> list[str]:
    """The sweep's methods (CONTENDER_RULE), from {benchmark: {slug: metrics}} on the inferred host."""
    exact = lossless_of({s for per in on_inferred.values() for s in per})
    keep = {"moespac", "llamacpp-sd", FITTED_ROW}
    for per in on_inferred.values():
        tps = {s: m["tokens_per_s"] for s, m in per.items() if exact[s] and s not in REFERENCE and s != "moespac"}
        if tps:
            keep |= {s for s, v in tps.items() if v * factor >= max(tps.values())}
    return [s for s in next(iter(on_inferred.values()), {}) if s in keep]  # the study's method order


def host_sweep(center, pool: list[str], benches: list[str], replay: Replays, workdir: Path) -> list[dict]:
    """One host parameter at a time moved from `center` (the inferred profile) to each of its plausible points
    (infer_host.PLAUSIBLE); at each, every method of `pool` on every benchmark of `benches` (tokens/s)."""
    points = [(field, label, value) for field, named in PLAUSIBLE.items() for label, value in named]
    paths = []
    for i, (field, label, value) in enumerate(points):
        paths.append(str(workdir / f"sweep-{field}-{i}.yaml"))
        Path(paths[-1]).write_text(profile_yaml(with_parameter(center, field, value,
                                                               f"plausible-range point: {label}")))
    replay.fill([(s, b, path) for path in paths for b in benches for s in pool], "host sweep replays")
    return [dict(parameter=field, label=label, value=value,
                 tps={b: {s: replay(s, b, path)["tokens_per_s"] for s in pool} for b in benches})
            for (field, label, value), path in zip(points, paths)]


def lossless_of(methods) -> dict[str, bool]:
    """{slug: whether its policy keeps the model's output exact}."""
    return {slug: make_policy(get_method(slug).policy).lossless for slug in methods}


def compare(tps: dict[str, float], lossless: dict[str, bool], method: str = "moespac",
            against: str = "llamacpp-sd") -> dict:
    """From {slug: tokens/s} of one benchmark: method / against - 1, method / best other - 1 and method / best
    lossless other - 1 (None where either is missing), with the best methods' slugs. Bounds are not methods."""
    mine, other = tps.get(method), tps.get(against)
    rest = {k: v for k, v in tps.items() if k != method and k not in REFERENCE}
    exact = {k: v for k, v in rest.items() if lossless.get(k, True)}
    ratio = lambda pool: None if mine is None or not pool else mine / max(pool.values()) - 1
    return dict(vs=None if mine is None or not other else mine / other - 1,
                vs_best=ratio(rest), best=max(rest, key=rest.get) if rest else None,
                vs_best_lossless=ratio(exact), best_lossless=max(exact, key=exact.get) if exact else None)


def gains(record: dict, method: str = "moespac", against: str = "llamacpp-sd", key: str = "methods") -> dict[str, dict]:
    """compare() per benchmark of one block of the record's rows ('methods' on the sourced host,
    'methods_inferred' on the inferred one)."""
    lossless = lossless_of(record["config"]["methods"])
    return {row["benchmark"]: compare({k: v["tokens_per_s"] for k, v in (row.get(key) or {}).items()}, lossless,
                                      method, against)
            for row in record["metrics"]["rows"]}


def mean_or_none(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None
