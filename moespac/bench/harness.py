"""The run harness: a benchmark's prompts through the real engine -> one result record, samples kept raw.

Protocol (paper Sec. 4.1): batch 1, at most 512 new tokens, gamma = 8, greedy, stop at EOS (`ignore_eos`
fixes the output length instead, as vLLM and optimum-benchmark do). Warm-up calls run first and are left
out. Every engine call (a batch of prompts at one conversation turn) starts with a cold expert cache, as
the simulator's requests do, and is one request of the activation trace; prefill and decode are timed apart.

timing 'measured': the numbers are the engine's wall clock. timing 'simulated': the same engine run only
records the trace (routing does not depend on the policy), which moespac.sim replays through the policy
on a hardware profile; per-request facts (tokens, acceptances) stay those of the engine run.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from moespac import datasets
from moespac.bench.record_files import load_valid_record, write_failure, write_result
from moespac.cache import COUNTERS, CacheSize  # the bench's counters are the cache's
from moespac.errors import MoespacError, check_context
from moespac.hashing import model_id, stable_hash
from moespac.record import make_record
from moespac.registry import parse_policy
from moespac.trace import bench_trace_id

log = logging.getLogger(__name__)

TURNS = ("all", "first")
TIMINGS = ("measured", "simulated")
TRACE_POLICY = "all-host"  # of a trace-only engine run: the hybrid split keeps the numerics, so any policy routes alike


@dataclass(frozen=True)
class BenchConfig(CacheSize):
    """One benchmark run (its device expert cache: CacheSize's fields)."""

    benchmark: str
    """Benchmark name (one of the seven; aliases accepted)."""
    target: str | None = None
    """Target MoE model: local folder or hub id (not needed with from_trace)."""
    draft: str | None = None
    """Draft model: local folder or hub id; None = autoregressive decoding."""
    policy: str = "moespac"
    """Scheduling policy, name[:key=value,...]."""
    method: str | None = None
    """The table row this run is a cell of (moespac/catalogue.py, e.g. 'hybrimoe' or 'moespac-k6'); checked
    against policy and decoding, written beside the config (a name of what ran, not part of its hash). None:
    tables name the row by its policy spec."""
    gamma: int = 8
    """Draft length; 0 = autoregressive (the draft is not loaded)."""
    batch_size: int = 1
    """Prompts per engine call (the paper: 1)."""
    max_new_tokens: int = 512
    """Generation length cap per request (the paper: 512)."""
    ignore_eos: bool = False
    """Generate exactly max_new_tokens (fixed output length) instead of stopping at EOS."""
    temperature: float = 0.0
    """0 = greedy; > 0 = speculative sampling at this temperature."""
    warmup: int = 1
    """Warm-up engine calls (each a batch of first turns) run before the measured ones and left out."""
    limit: int | None = None
    """Use a seeded sample of this many prompts; None = all."""
    seed: int = 0
    """Seed of the prompt sample and of sampling."""
    source: str = "offline"
    """Prompt source: 'offline' (committed sets) or 'hub'."""
    turns: str = "all"
    """'all' turns of multi-turn prompts (MT-bench; later turns follow the model's answers) or the 'first'."""
    copy_mode: str = "async"
    """Prefetch copies on a worker thread ('async') or at the end of the asking layer ('sync')."""
    self_draft_lookahead: bool = False
    """Speculative runs: also run the target with INT4 experts over each step's drafted tokens and keep its
    routing in the trace (signal 'self_draft_topk', MoE-SpeQ's lookahead); one more target pass per verify
    step, timed apart (lookahead_s) and left out of decode time. A policy that reads the signal (moe-speq)
    gets the pass without this flag."""
    dtype: str = "auto"
    """Model dtype: auto, fp32, bf16, fp16 or fp64."""
    device: str | None = None
    """Device for non-expert weights and the expert cache; None = cuda if available."""
    trust_remote_code: bool = False
    """Allow model code from the hub."""
    timing: str = "measured"
    """'measured' (the engine's wall clock) or 'simulated' (trace replayed on a hardware profile)."""
    hardware: str | None = None
    """Simulated only: built-in profile name or profile YAML path."""
    model_spec: str = "trace"
    """Simulated only: registry name whose expert sizes are simulated, or 'trace' (the traced model's)."""
    draft_spec: str | None = None
    """Simulated only: registry name (or model folder) of the draft whose cost is charged; None = the trace's
    draft folder if it has one, else qwen3-4b-fp8 (moespac.sim.simulate.resolve_draft)."""
    allow_topology_mismatch: bool = False
    """Simulated only: map trace layers/experts onto model_spec by modulo when they differ."""
    from_trace: str | None = None
    """Simulated only: replay this trace (recorded by a bench run) instead of running the engine."""
    warmup_steps: int | None = None
    """Simulated only: window of the 'warmup_counts' signal in steps of the trace's first request (0 = none);
    None = the simulator's default. A measured run's window is its `warmup` calls instead."""
    bounds: bool = True
    """Simulated: also replay the oracle and the infinite-cache bound (the record's distance to them); they cost
    more than the policy's own replay, so a study computes them once per trace, in its oracle cell."""
    profile_traces: tuple[str, ...] = ()
    """Simulated only: traces of other prompts whose routing is the profiling run (moespac.sim.simulate)."""

    def __post_init__(self):
        datasets.get_benchmark(self.benchmark)  # unknown name -> MoespacError naming it and the known ones
        checks = [
            (self.timing in TIMINGS, f"timing {self.timing!r}: 'measured' or 'simulated'"),
            (self.timing == "simulated" or not (self.hardware or self.from_trace or self.model_spec != "trace"
                                                 or self.draft_spec or self.warmup_steps is not None
                                                 or self.profile_traces),
             "hardware / from_trace / model_spec / draft_spec / warmup_steps / profile_traces need timing 'simulated'"),
            (self.timing == "measured" or bool(self.hardware), "timing 'simulated' needs hardware (a profile)"),
            (bool(self.target) or bool(self.from_trace), "target is required (or from_trace, to replay a trace)"),
            (self.gamma >= 0, f"gamma {self.gamma} must be >= 0"),
            (self.batch_size >= 1, f"batch_size {self.batch_size} must be >= 1"),
            (self.max_new_tokens >= 1, f"max_new_tokens {self.max_new_tokens} must be >= 1"),
            (self.warmup >= 0, f"warmup {self.warmup} must be >= 0"),
            (self.warmup_steps is None or self.warmup_steps >= 0, f"warmup_steps {self.warmup_steps} must be >= 0"),
            (self.limit is None or self.limit >= 1, f"limit {self.limit} must be >= 1"),
            (self.temperature >= 0, f"temperature {self.temperature} must be >= 0"),
            (self.source in datasets.SOURCES, f"source {self.source!r}: one of {', '.join(datasets.SOURCES)}"),
            (self.turns in TURNS, f"turns {self.turns!r}: one of {', '.join(TURNS)}"),
            (not self.self_draft_lookahead or (self.timing == "measured" and self.speculative),
             "self_draft_lookahead needs a measured speculative run (a draft and gamma >= 1): it records the "
             "self-draft's routing of the drafted tokens"),
        ]
        for ok, message in checks:
            if not ok:
                raise MoespacError(message)
        super().__post_init__()

    @property
    def speculative(self) -> bool:
        return bool(self.draft) and self.gamma > 0


@dataclass
class Prepared:
    """What a run resolves before any model is loaded: the hashed config, and the trace / profile it reads."""

    config: dict
    trace_config: dict
    """The part of the config that decides the trace (models by id, prompts, decoding)."""
    target: str | None
    draft: str | None
    """Model references as loaded: absolute paths of local folders, else hub ids."""
    trace: object = None  # moespac.trace.Trace when replaying from_trace
    profile: object = None  # moespac.sim.profile.HardwareProfile when simulated


# ---- entry points ---------------------------------------------------------------------------------------

def run_to_file(cfg: BenchConfig, out, trace_out=None, progress: bool = True, skip_valid: bool = False) -> dict:
    """Run and write the record to `out` atomically; on an error of the run write OUT.failure.json instead and
    re-raise. Input refused while preparing (a corrupt trace, a bad model folder) writes nothing: one line says it.

    skip_valid: when `out` already holds a valid, complete record of this very config, return it unrun.
    """
    try:
        prep = prepare(cfg)
    except MoespacError:
        raise
    except BaseException as e:  # interrupted or broken while loading: the pipeline's failure record
        write_failure(out, "bench", cfg.timing, {"requested": asdict(cfg)}, e)
        raise
    try:
        if skip_valid:
            old = load_valid_record(out, stable_hash(prep.config))
            if old is not None:
                return old
        record = execute(cfg, prep, trace_out, progress)
        write_result(out, record)
        return record
    except BaseException as e:
        write_failure(out, "bench", cfg.timing, prep.config, e)
        raise


def run_bench(cfg: BenchConfig, trace_out=None, progress: bool = True) -> dict:
    """Run `cfg` and return its record (nothing written but the optional trace)."""
    return execute(cfg, prepare(cfg), trace_out, progress)


def prepare(cfg: BenchConfig) -> Prepared:
    """Resolve the config that names this run (model ids, profile hash, trace id); fails fast on bad input."""
    from moespac.engine.session import resolve_device

    profile, trace = None, None
    if cfg.timing == "simulated":
        from moespac.sim.profile import load_profile
        from moespac.sim.simulate import SimConfig

        profile = load_profile(cfg.hardware)
        warmup_steps = SimConfig.warmup_steps if cfg.warmup_steps is None else cfg.warmup_steps
    if cfg.from_trace:
        from moespac.trace import load_trace

        trace = load_trace(cfg.from_trace)
        if not isinstance(trace.meta.get("bench"), dict):
            raise MoespacError(f"trace {cfg.from_trace} was not recorded by `moespac bench` (no per-request facts); "
                               "replay it with `moespac simulate`")
        tcfg, target, draft = trace.meta["bench"]["config"], trace.meta.get("target"), trace.meta.get("draft")
        if tcfg["benchmark"] != datasets.get_benchmark(cfg.benchmark).name:
            raise MoespacError(f"trace {cfg.from_trace} records benchmark {tcfg['benchmark']!r}, not {cfg.benchmark!r}")
    else:
        spec = cfg.speculative
        target, draft = _ref(cfg.target), _ref(cfg.draft) if spec else None
        tcfg = dict(benchmark=datasets.get_benchmark(cfg.benchmark).name, source=cfg.source, limit=cfg.limit,
                    seed=cfg.seed, turns=cfg.turns, target_id=model_id(target), draft_id=model_id(draft),
                    gamma=cfg.gamma if spec else 0, batch_size=cfg.batch_size, max_new_tokens=cfg.max_new_tokens,
                    ignore_eos=cfg.ignore_eos, temperature=cfg.temperature, dtype=cfg.dtype)
    config = dict(tcfg, timing=cfg.timing, policy=cfg.policy, cache_ratio=cfg.cache_ratio, cache_gib=cfg.cache_gib,
                  per_layer=cfg.per_layer)
    if cfg.method is not None:
        check_method(cfg.method, cfg.policy, int(tcfg["gamma"]) > 0)
    if cfg.timing == "measured":
        config.update(copy_mode=cfg.copy_mode, device=resolve_device(cfg.device), warmup=cfg.warmup)
        if cfg.self_draft_lookahead:  # named only when set: records of runs without it keep their hashes
            config["self_draft_lookahead"] = True
    else:
        config.update(hardware=profile.name, hardware_sha256=profile.sha256, model_spec=cfg.model_spec,
                      draft_spec=cfg.draft_spec, allow_topology_mismatch=cfg.allow_topology_mismatch,
                      warmup_steps=warmup_steps, bounds=cfg.bounds,
                      trace_id=trace.trace_id() if trace is not None else bench_trace_id(tcfg))
        if cfg.profile_traces:  # their ids, not their paths: the same routing is the same config
            from moespac.trace import load_trace

            config["profile_traces"] = [load_trace(p).trace_id() for p in cfg.profile_traces]
    return Prepared(config, tcfg, target, draft, trace, profile)


def check_method(method: str, policy: str, speculative: bool) -> None:
    """A run filed under a catalogue method must be that method: its policy spec, with a draft or without."""
    from moespac.catalogue import get_method

    m = get_method(method)
    decoding = lambda draft: "with a draft" if draft else "without a draft"  # noqa: E731
    if (m.policy, m.draft) != (policy, speculative):
        raise MoespacError(f"method {method!r} is policy {m.policy!r} {decoding(m.draft)}; this run is policy "
                           f"{policy!r} {decoding(speculative)}")


def _ref(ref: str | None) -> str | None:
    """A local model folder relative to the working directory when it lies inside it (so records and traces
    of two clones are byte-identical), else absolute; a hub id as given."""
    if not ref or not Path(ref).expanduser().is_dir():
        return ref
    folder = Path(ref).expanduser().resolve()
    try:
        return folder.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(folder)


def execute(cfg: BenchConfig, prep: Prepared, trace_out=None, progress: bool = True) -> dict:
    """Run (or replay) and assemble the record."""
    tcfg = prep.trace_config
    bench = datasets.get_benchmark(tcfg["benchmark"])
    trace_path = trace_out or cfg.from_trace
    warmup, memory = None, None  # the window of the 'warmup_counts' signal; the engine's memory plan
    if prep.trace is not None:
        trace = prep.trace
    else:
        every = datasets.load_benchmark(bench.name, source=cfg.source)
        prompts = datasets.seeded_sample(every, cfg.limit, cfg.seed)
        chosen = {p.id for p in prompts}
        others = [p for p in every if p.id not in chosen]  # the warm-up (profiling) run never sees a measured one
        trace, calls, policy_stats, warmup, memory = engine_run(cfg, prep, prompts, progress, others)
        if trace_out:
            trace.save(trace_out)
    if cfg.timing == "measured":
        extra = dict(profile=None, memory_plan=memory)
    else:
        calls, policy_stats, extra = simulated_calls(cfg, trace, trace_path, prep.config["warmup_steps"])
        warmup = extra["simulation"]["warmup_window"]
    facts = trace.meta["bench"]
    metrics, samples = summarize(facts["rows"], calls, trace)
    name, options = parse_policy(cfg.policy)
    proxy = any(facts["proxy"])
    return make_record(
        "bench", cfg.timing, prep.config, metrics, method=cfg.method,
        benchmark=dict(name=bench.name, display=bench.display, label=bench.proxy_label if proxy else bench.display,
                       source=tcfg["source"], proxy=proxy),
        models=dict(target=prep.target, draft=prep.draft, target_id=tcfg["target_id"], draft_id=tcfg["draft_id"],
                    card=_model_card(prep.target)),
        trace=dict(id=trace.trace_id(), path=str(trace_path) if trace_path else None, model=prep.target,
                   model_spec=trace.meta["model_spec"].get("name"), steps=trace.num_steps,
                   engine_policy=trace.meta.get("policy")),
        policy=dict(spec=cfg.policy, name=name, options=options, stats=policy_stats or {}, warmup_window=warmup),
        counts=dict(prompts=facts["prompts"], requests=len(samples), skipped=len(facts["skipped"]),
                    warmup=cfg.warmup if cfg.timing == "measured" else 0),
        requests=samples, calls=calls, skipped=facts["skipped"], **extra)


# ---- the engine run ----------------------------------------------------------------------------------------

def engine_run(cfg: BenchConfig, prep: Prepared, prompts: list, progress: bool = True, others: list = ()):
    """Run the prompts through the engine; returns (trace, calls with measured timing, policy stats, the
    window of the 'warmup_counts' signal or None, the memory plan's summary).

    The trace's meta['bench'] keeps the per-request facts (tokens, drafts, acceptances) and skips.
    The warm-up calls run `others` (prompts of the benchmark that are not measured; the measured ones only when
    there are no others) and are recorded apart: their routing counts are the profiling run of the measured
    calls ('warmup_counts': Fiddler's popularity profile; as one activation matrix, MoE-Infinity's collection).
    With no warm-up calls, a policy that reads a profile gets the counts of one prefill, run once untimed.
    """
    from moespac.models.specs import spec_from_config

    tcfg = prep.trace_config
    session = _open_session(cfg, prep)
    try:
        run, items = _start_run(cfg, session, tcfg, prompts)
        spec = spec_from_config(session.target.config, name=tcfg["target_id"]).to_dict()
        warmup = _warm_up(run, spec, items, others)
        session.record(spec, meta=dict(target=prep.target, draft=prep.draft, gamma=run.gamma,
                                       batch_size=cfg.batch_size, policy=_engine_policy(cfg)),
                       self_draft=cfg.self_draft_lookahead)
        _run_prompts(run, items, f"bench {tcfg['benchmark']}", progress)
        policy_stats = session.runtime.stats()["policy_stats"]
        trace = session.finish_trace(trace_id=bench_trace_id(tcfg), bench=dict(
            config=tcfg, prompts=len(prompts), rows=run.rows, skipped=run.skipped, proxy=[p.proxy for p in prompts]))
    finally:
        session.close()
    return trace, run.calls, policy_stats, warmup, _memory_summary(session.plan)


@dataclass
class _EngineRun:
    """What the steps of one engine run share: the session, the decoding settings, and what its calls produced."""

    cfg: BenchConfig
    session: object
    """The open moespac.engine.session.EngineSession."""
    gamma: int
    context: int
    """The target's positions: a prompt, its new tokens and a verify pass's overrun must fit in them."""
    skipped: list
    """Prompts and later turns that do not fit ({id, reason}); the trace keeps them."""
    warmup_counts: np.ndarray | None
    """The 'warmup_counts' signal of every call: zeros during the warm-up (nothing seen yet), then its window
    (None when the warm-up routed nothing)."""
    rows: list = field(default_factory=list)
    """One per request (a prompt at one turn): its facts."""
    calls: list = field(default_factory=list)
    """One per measured engine call: its timing and cache counters."""

    @property
    def measured(self) -> bool:
        return self.cfg.timing == "measured"


def _engine_policy(cfg: BenchConfig) -> str:
    return cfg.policy if cfg.timing == "measured" else TRACE_POLICY


def _open_session(cfg: BenchConfig, prep: Prepared):
    """The engine session of the run; a simulated run's engine only records the trace (no device cache)."""
    from moespac.engine.session import EngineConfig, EngineSession

    measured = cfg.timing == "measured"
    return EngineSession.open(EngineConfig(
        target=prep.target, draft=prep.draft, dtype=cfg.dtype, device=cfg.device,
        trust_remote_code=cfg.trust_remote_code, policy=_engine_policy(cfg),
        cache_ratio=cfg.cache_ratio if measured else 0.0, cache_gib=cfg.cache_gib if measured else None,
        per_layer=cfg.per_layer, copy_mode=cfg.copy_mode, context=cfg.max_new_tokens + 2048,
        batch_size=cfg.batch_size, gamma=prep.trace_config["gamma"]))


def _start_run(cfg: BenchConfig, session, tcfg: dict, prompts: list) -> tuple[_EngineRun, list]:
    """(the run's shared state, the (prompt, ids) pairs that fit the target's context); none fitting is an error."""
    gamma = tcfg["gamma"]
    context = int(getattr(session.target.config, "max_position_embeddings", 0) or 2**31)
    items, skipped = fit_prompts(prompts, session.tokenizer, context, cfg.max_new_tokens, gamma)
    if not items:
        raise MoespacError(f"benchmark {tcfg['benchmark']!r}: all {len(prompts)} prompts were skipped "
                           f"(first: {skipped[0]['reason']})")
    topo = session.topology
    none_seen = np.zeros((topo.num_layers, topo.num_experts), np.int64)
    return _EngineRun(cfg, session, gamma, context, skipped, warmup_counts=none_seen), items


def _call(run: _EngineRun, batch: list[list[int]], request: int, max_new_tokens: int | None = None):
    """One engine call (request -1: a warm-up call) -> (results, runtime stats); each request samples with its
    own seed."""
    from moespac.engine.speculative import Sampling

    cfg, counts = run.cfg, run.warmup_counts
    sampling = Sampling(temperature=cfg.temperature, seed=cfg.seed + max(request, 0))
    return run.session.generate(
        batch, gamma=run.gamma, max_new_tokens=cfg.max_new_tokens if max_new_tokens is None else max_new_tokens,
        sampling=sampling, request=request, ignore_eos=cfg.ignore_eos, warmup_counts=counts,
        max_batch=cfg.batch_size, history=None if counts is None or not counts.any() else counts[None])


def _warm_up(run: _EngineRun, spec: dict, items: list, others) -> dict | None:
    """Run the warm-up calls in a trace of their own: its routing sets the 'warmup_counts' signal of the calls
    that follow. Returns the signal's window (None when the warm-up routed nothing)."""
    from moespac.sim.replay import warmup_window

    run.session.record(spec, cross_layer=False)
    used, source = _warm_up_calls(run, *_warm_up_pool(run, items, others))
    seen = run.session.finish_trace()
    run.warmup_counts, warmup = None, None
    if seen.num_steps:
        run.warmup_counts, warmup = warmup_window(seen.counts(), seen.steps["step_request"])
        warmup = dict(warmup, source=source, prompts=list(dict.fromkeys(used)))
    return warmup


def _warm_up_pool(run: _EngineRun, items: list, others) -> tuple[list, str]:
    """(the prompts the warm-up draws from, how to name them): unmeasured prompts that fit, else the measured."""
    cfg = run.cfg
    spare = fit_prompts(list(others)[:max(cfg.warmup, 1) * cfg.batch_size], run.session.tokenizer, run.context,
                        cfg.max_new_tokens, run.gamma)[0] if run.measured else []
    return (spare, "other prompts, not measured") if spare else (items, "measured prompts: no other")


def _warm_up_calls(run: _EngineRun, pool: list, whose: str) -> tuple[list, str]:
    """The warm-up calls of a measured run, cycling through `pool` -> (prompt ids used, the source's wording).
    Without any, a policy that reads a profile still gets one untimed prefill."""
    cfg, used = run.cfg, []
    for w in range(cfg.warmup if run.measured else 0):
        batch = [pool[(w * cfg.batch_size + j) % len(pool)] for j in range(min(cfg.batch_size, len(pool)))]
        _call(run, [ids for _, ids in batch], -1)
        used += [p.id for p, _ in batch]
    source = f"{cfg.warmup} warm-up call(s) on {whose}"
    if run.measured and not cfg.warmup and run.session.runtime.policy.uses_profile():
        batch = pool[:cfg.batch_size]
        _call(run, [ids for _, ids in batch], -1, max_new_tokens=1)  # prefill only
        used += [p.id for p, _ in batch]
        source = f"one prefill on {whose}, run once untimed (warmup 0)"
    return used, source


def _run_prompts(run: _EngineRun, items: list, desc: str, progress: bool) -> None:
    """Every measured prompt, batch_size at a time, behind a progress bar (on stderr; off with progress=False)."""
    from tqdm import tqdm

    size = run.cfg.batch_size
    with tqdm(total=len(items), unit="prompt", desc=desc, leave=False, disable=not progress, file=sys.stderr,
              mininterval=1.0) as bar:
        for start in range(0, len(items), size):
            _run_turns(run, items[start:start + size])
            bar.update(min(size, len(items) - start))


def _run_turns(run: _EngineRun, group: list) -> None:
    """Every turn of a batch of prompts, one engine call per turn (later turns carry the earlier answers)."""
    tok = run.session.tokenizer
    answers = {p.id: [] for p, _ in group}
    pending, turn = group, 1
    while pending:
        index = len(run.calls)
        results, stats = _call(run, [ids for _, ids in pending], index)
        run.calls.append(_call_facts(index, len(pending), results[0], stats))
        for (p, _), r in zip(pending, results):
            run.rows.append(_request_facts(run, p.id, turn, index, r))
            answers[p.id].append(tok.decode(r.tokens, skip_special_tokens=True))
        pending = next_turn(pending, answers, turn, run.cfg, tok, run.context, run.gamma, run.skipped)
        turn += 1


def _call_facts(index: int, size: int, first, stats: dict) -> dict:
    """One engine call's record: its timing (every sequence of a batch shares it) and cache counters."""
    return dict(call=index, size=size, prefill_s=first.prefill_s, decode_s=first.decode_s, draft_s=first.draft_s,
                target_s=first.target_s,
                # the self-draft pass ran (the trace keeps it, or the policy reads it): its time
                **({"lookahead_s": first.lookahead_s} if first.lookahead_s else {}),
                counters={k: int(stats[k]) for k in COUNTERS})


def _request_facts(run: _EngineRun, prompt_id: str, turn: int, call: int, r) -> dict:
    """One request's row: a prompt at one turn (later turns are named id#turn) and its decoding facts."""
    eos = run.session.tokenizer.eos_token_id
    return dict(id=prompt_id if turn == 1 else f"{prompt_id}#{turn}", prompt_id=prompt_id, turn=turn, call=call,
                prompt_tokens=r.prompt_tokens, new_tokens=len(r.tokens), steps=r.steps, drafted=r.drafted,
                accepted=r.accepted, rejected=r.rejected,
                eos=bool(not run.cfg.ignore_eos and r.tokens[-1] == eos))


def _memory_summary(plan) -> dict | None:
    """The engine's memory plan in the record (None: no plan, e.g. a trace-only run)."""
    if plan is None:
        return None
    return dict(slots=plan.slots, cache_ratio=plan.cache_ratio, chosen=plan.requested,
                device_bytes=plan.device_total, host_peak_bytes=plan.host_peak)


def fit_prompts(prompts, tokenizer, context: int, max_new_tokens: int, gamma: int):
    """(fitting (prompt, ids) pairs, skipped [{id, reason}]): first turns that leave room for the new tokens
    and the gamma + 1 positions a verify pass runs past the text."""
    # not even a one-token prompt fits: a config error, not a skip
    check_context(f"--max-new-tokens {max_new_tokens}: a one-token prompt", 1, max_new_tokens, gamma, context)
    enc = datasets.encode_prompts(prompts, tokenizer, max_context=context - gamma - 1, max_new_tokens=max_new_tokens)
    return enc.items, [dict(id=pid, reason=_room(reason, context, gamma)) for pid, reason in enc.skipped]


def next_turn(pending, answers, turn: int, cfg: BenchConfig, tokenizer, context: int, gamma: int, skipped: list):
    """The (prompt, ids) of the next turn of every pending multi-turn prompt; turns that do not fit are skipped."""
    if cfg.turns == "first":
        return []
    out = []
    for p, _ in pending:
        if turn < len(p.turns):
            ids = datasets.format_prompt(p, tokenizer, answers[p.id])
            reason = datasets.check_fits(ids, context - gamma - 1, cfg.max_new_tokens)
            if reason is None:
                out.append((p, ids))
            else:
                log.warning("skipping %s turn %d: %s", p.id, turn + 1, reason)
                skipped.append(dict(id=f"{p.id}#{turn + 1}", reason=_room(reason, context, gamma)))
    return out


def _room(reason: str, context: int, gamma: int) -> str:
    return f"{reason} (the model's {context} less {gamma + 1} positions a forward may run past the text)"


# ---- the simulated timing ----------------------------------------------------------------------------------

def simulated_calls(cfg: BenchConfig, trace, trace_path, warmup_steps: int) -> tuple[list[dict], dict, dict]:
    """Replay the trace: (calls with simulated timing and counters, policy stats, the record's profile and
    simulation sections)."""
    from moespac.sim.simulate import SimConfig, simulate

    sim = simulate(SimConfig(trace=str(trace_path or ""), policy=cfg.policy, hardware=cfg.hardware,
                             model_spec=cfg.model_spec, draft_spec=cfg.draft_spec, cache_ratio=cfg.cache_ratio,
                             cache_gib=cfg.cache_gib, per_layer=cfg.per_layer,
                             allow_topology_mismatch=cfg.allow_topology_mismatch,
                             warmup_steps=warmup_steps, bounds=cfg.bounds,
                             profile_traces=tuple(cfg.profile_traces)), trace)
    sizes = {}
    for row in trace.meta["bench"]["rows"]:
        sizes[row["call"]] = sizes.get(row["call"], 0) + 1
    calls = [dict(call=r["request"], size=sizes.get(r["request"], 0), prefill_s=r["prefill_s"], decode_s=r["decode_s"],
                  counters={k: int(r["counters"][k]) for k in COUNTERS}) for r in sim["requests"]]
    m = sim["metrics"]
    simulation = dict(config_hash=sim["config_hash"], model_spec=sim["model_spec"], draft=sim["draft"],
                      cache=sim["cache"], topology_mapping=sim["topology_mapping"], unit_costs=sim["unit_costs"],
                      breakdown_decode_s=m["breakdown_decode_s"], breakdown_prefill_s=m["breakdown_prefill_s"],
                      link_busy_s=m["link_busy_s"], link_utilisation=m["link_utilisation"],
                      bounds=sim.get("bounds"), distance=sim.get("distance"), warmup_window=sim["warmup_window"])
    return calls, sim["policy"]["stats"], dict(profile=sim["profile"], simulation=simulation)


# ---- metrics -----------------------------------------------------------------------------------------------

def summarize(rows: list[dict], calls: list[dict], trace) -> tuple[dict, list[dict]]:
    """(metrics, per-request samples): each request's facts with its call's timing; totals over calls."""
    from moespac.scheduler import metrics as sm

    by_call = {c["call"]: c for c in calls}
    samples = []
    for r in rows:
        c = by_call[r["call"]]
        latency = c["prefill_s"] + c["decode_s"]
        samples.append(dict(
            r, prefill_s=c["prefill_s"], decode_s=c["decode_s"], latency_s=latency,
            tokens_per_s=(r["new_tokens"] - 1) / c["decode_s"] if c["decode_s"] > 0 and r["new_tokens"] > 1 else None,
            tokens_per_s_e2e=r["new_tokens"] / latency if latency > 0 else None,
            acceptance_rate=r["accepted"] / r["drafted"] if r["drafted"] else None,
            omega=(r["new_tokens"] - 1) / r["steps"] if r["steps"] else None))
    counters = {k: sum(c["counters"][k] for c in calls) for k in COUNTERS}
    activations = counters["hits"] + counters["loads"] + counters["host"]
    drafted, accepted = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
    steps = sum(r["steps"] for r in rows)
    new_tokens = sum(r["new_tokens"] for r in rows)
    # rows of traces recorded before `rejected` was kept have no alpha
    rejected = sum(r["rejected"] for r in rows) if all("rejected" in r for r in rows) else None
    alpha = accepted / (accepted + rejected) if rejected is not None and accepted + rejected else None
    engine_s = sum(c["prefill_s"] + c["decode_s"] for c in calls)
    gamma = int(trace.meta["bench"]["config"]["gamma"])
    try:
        hot_cold = sm.hot_cold_accuracy(trace)["accuracy"]
        cost = sm.expert_cost_ratio(trace)
    except MoespacError as e:  # e.g. no decode steps at all
        log.warning("trace metrics unavailable: %s", e)
        hot_cold, cost = None, {}
    metrics = dict(
        requests=len(samples), new_tokens=new_tokens,
        tokens_per_s=stats(s["tokens_per_s"] for s in samples),
        tokens_per_s_e2e=stats(s["tokens_per_s_e2e"] for s in samples),
        throughput_tokens_per_s=new_tokens / engine_s if engine_s > 0 else None,
        latency_s=stats(s["latency_s"] for s in samples), prefill_s=stats(s["prefill_s"] for s in samples),
        decode_s=stats(s["decode_s"] for s in samples), tokens_per_request=stats(r["new_tokens"] for r in rows),
        drafted=drafted, accepted=accepted, acceptance_rate=accepted / drafted if drafted else None, alpha=alpha,
        omega=(new_tokens - len(rows)) / steps if steps else None, omega_from_alpha=sm.omega(gamma, alpha),
        hit_rate=counters["hits"] / activations if activations else None,
        host_share=counters["host"] / activations if activations else None,
        link_bytes=counters["bytes_copied"], counters=dict(counters, activations=activations),
        hot_cold_accuracy=_finite(hot_cold), smape=_finite(sm.smape(trace)),
        expert_cost_ratio={k: _finite(v) for k, v in cost.items()} or None)
    return metrics, samples


def stats(values) -> dict:
    """n, mean, std (population), p50, p90, min, max of the non-None values (None when there are none)."""
    x = np.array([v for v in values if v is not None], dtype=np.float64)
    if not len(x):
        return dict(n=0, mean=None, std=None, p50=None, p90=None, min=None, max=None)
    return dict(n=len(x), mean=float(x.mean()), std=float(x.std()), p50=float(np.percentile(x, 50)),
                p90=float(np.percentile(x, 90)), min=float(x.min()), max=float(x.max()))


def _finite(x):
    return float(x) if x is not None and math.isfinite(x) else None


# ---- ids -------------------------------------------------------------------------------------------------

def _model_card(target: str | None) -> dict | None:
    """Title and disclaimer of the pair's model_card.json (a locally trained proxy says so), if it has one."""
    if not target:
        return None
    card = Path(target).expanduser().parent / "model_card.json"
    if not card.is_file():
        return None
    try:
        d = json.loads(card.read_text())
    except ValueError:
        return None
    return {k: d.get(k) for k in ("title", "disclaimer")}
