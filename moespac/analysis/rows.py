"""Result records -> one flat row per cell (pandas), the only input of every table and figure.

A row says what was run (method, benchmark, settings), how its numbers were obtained (timing label,
hardware, the model that produced them) and the numbers (TPS, latency, acceptance, cache hits, a/b).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pandas as pd

from moespac.errors import MoespacError

# rows of wrapped systems that are not a catalogue method (the authors' code: a reference, not our MoE-SpAc row)
WRAPPED_LABELS = {"moespac-release": "MoE-SpAc (authors' release)"}

COLUMNS = ["path", "kind", "timing", "method", "label", "benchmark", "policy", "speculative", "gamma", "batch_size",
           "max_new_tokens", "cache_ratio", "proxy_prompts", "hardware", "model", "source", "tps", "latency_s",
           "acceptance_rate", "alpha", "omega", "hit_rate", "host_share", "a_over_b", "a_over_b_per_token",
           "hot_cold_accuracy", "requests",
           "skipped", "skip_reason", "draft_charged", "note", "mapping", "tps_lo", "tps_hi", "latency_lo", "latency_hi",
           "config_hash", "stand_in", "variants", "lossy", "busy_share"]
# a measured row of a baseline is our engine running that system's policy, not the system itself (that is a W row)
ENGINE_NOTE = "this engine running its policy"


# the wrapped record's metrics that are the table's TPS and latency (MLflow logs them under the table's names)
WRAPPED_METRICS = {"tps": "decode_tokens_per_s_mean", "latency_s": "latency_s_mean"}


def machine_name(env: dict) -> str:
    """The machine a timed record ran on, named one way for every record kind: the GPU, else the CPU and the
    threads it ran with."""
    gpu = env.get("gpu")
    if gpu:
        return gpu["name"]
    threads = env.get("cpu_threads")
    return f"CPU ({env.get('cpu') or '?'}" + (f", {threads} thread{'s' if threads != 1 else ''})" if threads else ")")


def label_of(method: str) -> str:
    from moespac.catalogue import get_method

    try:
        return get_method(method).label
    except MoespacError:
        return method


@functools.lru_cache(maxsize=None)
def _policy(spec: str | None):
    """The policy a row's spec builds (once per spec), or None for no spec or one this checkout cannot build."""
    from moespac.registry import make_policy

    if not spec:
        return None
    try:
        return make_policy(spec)
    except MoespacError:
        return None


def stand_in_of(spec: str | None) -> str | None:
    """What a policy approximates of its system (Policy.stand_in, what `moespac policy list` shows), or None
    for a policy that is its system's rule itself or a spec this checkout cannot build."""
    policy = _policy(spec)
    return (policy.stand_in or None) if policy is not None else None


def lossy_of(spec: str | None) -> bool:
    """Whether a row's policy changes what the model computes (Policy.lossless false: Fate's INT4 experts,
    SpecExp's speculated ones); False where it cannot be built here."""
    policy = _policy(spec)
    return policy is not None and not policy.lossless


def variants_of(spec: str | None) -> str | None:
    """The other settings of a row's system (Policy.variants) and which one the row runs, for the table's
    footnote; None where the policy has none or cannot be built here."""
    from moespac.registry import parse_policy

    policy = _policy(spec)
    if policy is None:
        return None
    name, options = parse_policy(spec)
    chosen = {f"{k}={v}".lower() for k, v in options.items()}
    other = [f"`{name}:{o}` ({what})" for o, what in policy.variants.items() if o.lower() not in chosen]
    return None if not other else f"the row runs `{spec}`; not shown: " + "; ".join(other)


def read_json(path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise MoespacError(f"record {path}: cannot read ({e})") from None


def _mean(stat):
    """metrics fields are either numbers or {n, mean, ...} summaries."""
    if isinstance(stat, dict):
        return stat.get("mean")
    return stat


def short(name) -> str | None:
    """A model folder as the project names it (relative to the working directory), hub ids unchanged."""
    if name is None:
        return None
    text = str(name)
    try:
        return str(Path(text).relative_to(Path.cwd())) if Path(text).is_absolute() else text
    except ValueError:
        return text


def _num(x):
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def bench_row(rec: dict) -> dict:
    c, m = rec["config"], rec["metrics"]
    speculative = int(c.get("gamma") or 0) > 0
    # the row the run was filed under (`bench --method`); a run without one is named by its policy spec
    method = rec.get("method") or f"{c['policy']}{' w/ SD' if speculative else ''}"
    cost = m.get("expert_cost_ratio") or {}
    if rec["timing"] == "simulated":
        sim = rec.get("simulation") or {}
        mapping = sim.get("topology_mapping") or ""
        mapped = (f" (trace {'layers/experts' if 'num_experts=' in mapping or 'top_k=' in mapping else 'layers'}"
                  " mapped)" if mapping else "")  # what differs: topology_mismatch names each field
        charged = sim.get("draft") or {}
        draft = short(charged.get("spec"))
        draft_charged = f"{draft} ({charged.get('source') or '?'})" if draft else None
        hardware = c.get("hardware")
        model = f"{c.get('model_spec')} experts{mapped}"
        imported = f" (imported: {c['imported'].get('format')})" if isinstance(c.get("imported"), dict) else ""
        source = (f"trace of {short(c.get('target_id') or c.get('target'))}{imported}"
                  + (f"; draft cost of {draft}" if draft else ""))
    else:
        hardware = machine_name(rec.get("environment") or {})
        model = short(c.get("target_id") or c.get("target"))
        source = f"draft {short(c.get('draft_id') or c.get('draft'))}" if speculative else "no draft"
        draft_charged = None  # measured: the draft in `source` ran for real
    return dict(
        kind="bench", timing=rec["timing"], method=method, label=label_of(method), benchmark=c["benchmark"],
        policy=c["policy"], speculative=speculative, gamma=int(c.get("gamma") or 0), batch_size=c.get("batch_size"),
        max_new_tokens=c.get("max_new_tokens"), cache_ratio=c.get("cache_ratio"),
        proxy_prompts=bool((rec.get("benchmark") or {}).get("proxy")), hardware=hardware, model=model,
        source=source, tps=_num(_mean(m.get("tokens_per_s"))), latency_s=_num(_mean(m.get("latency_s"))),
        acceptance_rate=_num(m.get("acceptance_rate")), alpha=_num(m.get("alpha")), omega=_num(m.get("omega")),
        hit_rate=_num(m.get("hit_rate")),
        host_share=_num(m.get("host_share")), a_over_b=_num(cost.get("a_over_b")),
        a_over_b_per_token=_num(cost.get("per_token")), hot_cold_accuracy=_num(m.get("hot_cold_accuracy")),
        requests=m.get("requests"), skipped=False, skip_reason=None, draft_charged=draft_charged,
        note=_bench_note(rec), mapping=(rec.get("simulation") or {}).get("topology_mapping"),
        stand_in=stand_in_of(c["policy"]), variants=variants_of(c["policy"]), lossy=lossy_of(c["policy"]),
        busy_share=busy_share(rec))


def busy_share(rec: dict) -> float | None:
    """Other processes' share of the CPUs while a timed record's command ran (record.machine_load); None for a
    simulated record or one that does not say."""
    if rec.get("timing") == "simulated":
        return None
    return _num((rec.get("machine_load") or {}).get("other_cpu_share"))


def _bench_note(rec: dict) -> str | None:
    """What a bench row is beyond its label: the engine running a baseline's policy (measured), llama.cpp's
    placement by its flag."""
    notes = []
    if rec["timing"] == "measured" and not rec["config"]["policy"].startswith("moespac"):
        notes.append(ENGINE_NOTE)
    stats = (rec.get("policy") or {}).get("stats") or {}
    if stats.get("n_cpu_moe") is not None and not stats.get("cpu_moe"):  # the -ot exps=CPU rows say it in the label
        notes.append(f"--n-cpu-moe {stats['n_cpu_moe']}")
    return "; ".join(notes) or None


def wrapped_row(rec: dict) -> dict:
    c, m = rec["config"], rec["metrics"]
    system = rec.get("system") or c.get("system")
    speculative = bool(c.get("speculative"))
    method = rec.get("method") or system  # the row it was filed under (`wrapped --method`)
    models = rec.get("models") or {}
    return dict(
        kind="wrapped", timing="wrapped", method=method, label=WRAPPED_LABELS.get(method) or label_of(method),
        benchmark=c.get("benchmark"),
        policy=system, speculative=speculative,
        gamma=int((c.get("run") or {}).get("draft_max") or 0) if speculative else 0,
        batch_size=1, max_new_tokens=c.get("max_new_tokens"), cache_ratio=None,
        proxy_prompts=_offline_proxy(c.get("benchmark")),
        hardware=machine_name(rec.get("environment") or {}),
        model=models.get("target_id") or short(c.get("model_pair")),
        source=f"{system} {c.get('version', '')}".strip(),
        tps=_num(m.get(WRAPPED_METRICS["tps"], m.get("decode_tokens_per_s"))),
        latency_s=_num(m.get(WRAPPED_METRICS["latency_s"])),
        acceptance_rate=_num(m.get("acceptance_rate")), alpha=None, omega=None, hit_rate=None, host_share=None,
        a_over_b=None, a_over_b_per_token=None, hot_cold_accuracy=None, requests=m.get("requests"),
        skipped=bool(rec.get("skipped")), skip_reason=rec.get("skip_reason"), draft_charged=None,
        note="nothing offloaded: no GPU" if (rec.get("placement") or {}).get("offloaded") is False else None,
        busy_share=busy_share(rec))


def _offline_proxy(benchmark) -> bool:
    """Whether the offline prompts of `benchmark` (what the wrapped systems run) are a proxy set."""
    from moespac.datasets import get_benchmark

    try:
        return get_benchmark(benchmark).proxy_label is not None
    except MoespacError:
        return False


def interval_columns(tps, latency) -> dict:
    """tps_lo/hi and latency_lo/hi: the 95 % Student-t intervals of the means of these per-request samples
    (None with fewer than two)."""
    from moespac.analysis.intervals import mean_interval

    out = {}
    for col, samples in (("tps", tps), ("latency", latency)):
        ci = mean_interval(samples or [])
        out[f"{col}_lo"], out[f"{col}_hi"] = ci if ci else (None, None)
    return out


def _intervals(rec: dict, tps_key: str) -> dict:
    """The row's TPS and latency intervals over its requests (interval_columns)."""
    requests = rec.get("requests") if isinstance(rec.get("requests"), list) else []
    return interval_columns([r.get(tps_key) for r in requests], [r.get("latency_s") for r in requests])


def record_row(path, rec: dict | None = None) -> dict:
    """One record file (already read: `rec`) -> one row (MoespacError for a failure record or an unknown kind)."""
    from moespac.bench.record_files import validate_record

    rec = read_json(path) if rec is None else rec
    if not isinstance(rec, dict):
        raise MoespacError(f"record {path}: not a record (a JSON {type(rec).__name__})")
    try:
        validate_record(rec)
    except MoespacError as e:  # a parseable file of the wrong shape: say where, not a KeyError
        raise MoespacError(f"record {path}: {str(e).removeprefix('record: ')}") from None
    kind = rec.get("kind")
    if kind == "paper-regime":
        raise MoespacError(f"record {path}: a paper-regime study holds many cells: load_rows reads it (regime_rows)")
    if kind == "bench":
        row = dict(bench_row(rec), **_intervals(rec, "tokens_per_s"))
    elif kind == "wrapped":
        row = dict(wrapped_row(rec), **_intervals(rec, "decode_tokens_per_s"))
    elif kind == "simulate":  # what `moespac simulate` writes for a trace of no benchmark
        raise MoespacError(f"record {path}: the replay of a trace that names no benchmark is not a table cell; "
                           "`moespac simulate --method NAME` on a bench trace writes one")
    else:
        raise MoespacError(f"record {path}: kind {kind!r} is not a benchmark cell")
    if row["timing"] != rec.get("timing"):
        raise MoespacError(f"record {path}: timing label {rec.get('timing')!r} disagrees with its kind")
    return dict(row, path=str(path), config_hash=rec.get("config_hash"))


INFINITE_CACHE = "infinite-cache"


def bound_row(row: dict, rec: dict) -> dict | None:
    """The infinite-cache bound a simulated record computed (its oracle cell does), as a row of its own: the
    throughput no policy can beat on that trace, hardware and draft (moespac/sim/bounds.py). It bounds the
    policies run on the same trace (with the draft, for the oracle's SD trace), not the autoregressive rows."""
    bound = ((rec.get("simulation") or {}).get("bounds") or {}).get("infinite_cache")
    if rec.get("timing") != "simulated" or not bound:
        return None
    blank = dict.fromkeys(("tps_lo", "tps_hi", "latency_lo", "latency_hi", "acceptance_rate", "alpha", "omega",
                           "hit_rate", "host_share", "a_over_b",
                           "a_over_b_per_token", "hot_cold_accuracy"))
    label = "Infinite cache w/ SD (bound)" if row["speculative"] else "Infinite cache (bound)"
    return dict(row, **blank, method=INFINITE_CACHE, label=label, policy=INFINITE_CACHE,
                tps=_num(bound.get("tokens_per_s")), latency_s=_num(bound.get("latency_s")),
                config_hash=f"{row['config_hash']}:{INFINITE_CACHE}")


REGIME_KINDS = {"table1": "regime:table1", "table2": "regime:table2", "table4": "regime:table4"}
REGIME_ROUTING = "paper-regime routing: synthetic, fitted to the paper's App. A.1; no model ran"
"""What a paper-regime block's model column says its routing is (the audit tells those blocks apart by it)."""
"""The row kind of a paper-regime record's cells per table (for_table keeps each table's own)."""


def regime_rows(rec: dict) -> list[dict]:
    """The cells of a paper-regime study (moespac/experiments/paper_regime.py) as table rows: every Table 1 method
    and every Table 2 variant on synthetic routing fitted to the paper's A.1, on the inferred host where the
    study inferred one (else the sourced profile), one block of their own (its hardware and model say both)."""
    from moespac.catalogue import get_method

    c, m = rec["config"], rec["metrics"]
    host = m.get("inferred_host") or {}
    hardware = (f"{c['hardware']}-paper-inferred (host bandwidth {host['value'] / 1e9:.1f} GB/s inferred from the "
                "paper's llama.cpp rows)" if host else c["hardware"])
    model = f"{c['model_spec']} experts ({REGIME_ROUTING})"
    out = []
    for r in m["rows"]:
        blocks = (("table1", r.get("methods_inferred") if host else r.get("methods")), ("table2", r.get("table2")))
        for table, cells in blocks:
            for slug, got in (cells or {}).items():
                method = get_method(slug)
                per = got.get("per_request") or {}
                row = dict(kind=REGIME_KINDS[table], timing=rec["timing"], method=slug, label=method.label,
                           benchmark=r["benchmark"], policy=method.policy, speculative=method.draft,
                           gamma=c["gamma"] if method.draft else 0, batch_size=1, max_new_tokens=c["new_tokens"],
                           cache_ratio=c["cache_ratio"], proxy_prompts=False, hardware=hardware,
                           model=model,
                           source=(r["sd_trace"] if method.draft else r["ar_trace"])
                           + (f"; draft cost of {c['draft_spec']}" if method.draft else ""),
                           tps=_num(got.get("tokens_per_s")), latency_s=_num(got.get("latency_s")),
                           hit_rate=_num(got.get("hit_rate")), host_share=_num(got.get("host_share")),
                           alpha=_num(r["measured"].get("alpha")) if method.draft else None,
                           a_over_b_per_token=_num(r["measured"].get("a_over_b")) if method.draft else None,
                           requests=len(per.get("tokens_per_s") or []) or None, skipped=False,
                           draft_charged=f"{c['draft_spec']} (spec)" if method.draft else None,
                           stand_in=stand_in_of(method.policy), variants=variants_of(method.policy),
                           lossy=lossy_of(method.policy),
                           config_hash=f"{rec['config_hash']}:{table}:{r['benchmark']}:{slug}")
                out.append(dict(row, **interval_columns(per.get("tokens_per_s"), per.get("latency_s"))))
    return out + _regime_table4(rec, hardware, model)


def _regime_table4(rec: dict, hardware: str, model: str) -> list[dict]:
    """Table 4's cells of a paper-regime study: MoE-SpAc per sequence on batched traces (intervals over calls)."""

    c, t4 = rec["config"], rec["metrics"].get("table4") or {}
    out = []
    for cell in t4.get("cells") or []:
        b = cell["batch_size"]
        per = cell["per_request"]
        row = dict(kind=REGIME_KINDS["table4"], timing=rec["timing"], method="moespac", label=label_of("moespac"),
                   benchmark=t4["benchmark"], policy="moespac", speculative=True, gamma=cell["gamma"], batch_size=b,
                   max_new_tokens=c["new_tokens"], cache_ratio=c["cache_ratio"], proxy_prompts=False,
                   hardware=hardware, model=model, source=f"{cell['trace']}; draft cost of {c['draft_spec']}",
                   tps=_num(cell["tokens_per_s"]), latency_s=_num(cell["latency_s"]), hit_rate=_num(cell["hit_rate"]),
                   requests=len(per["aggregate_tokens_per_s"]), skipped=False,
                   draft_charged=f"{c['draft_spec']} (spec)",
                   config_hash=f"{rec['config_hash']}:table4:b{b}:g{cell['gamma']}")
        out.append(dict(row, **interval_columns([v / b for v in per["aggregate_tokens_per_s"]], per["latency_s"])))
    return out


def for_table(rows: pd.DataFrame, table: str | None) -> pd.DataFrame:
    """The rows a table shows: every record's, but of a paper-regime study only the cells made for it (Table 1's
    methods, Table 2's variants, Table 4's grid; Appendix A.1 reads Table 1's; None, as the figures ask: none)."""
    own = REGIME_KINDS.get("table1" if table == "appendix_a1" else table)
    regime = rows["kind"].astype(str).str.startswith("regime:")
    return rows[~regime | (rows["kind"] == own)].reset_index(drop=True)


def load_rows(paths) -> pd.DataFrame:
    """Rows of every benchmark record in `paths` (other files are ignored: traces, numerics), plus the
    infinite-cache bound of each simulated record that computed it, and every cell of a paper-regime study."""
    rows = []
    for p in paths:
        if str(p).endswith(".json"):
            rec = read_json(p)
            if isinstance(rec, dict) and rec.get("kind") == "paper-regime":
                from moespac.bench.record_files import validate_record

                validate_record(rec)
                rows += [dict(row, path=str(p)) for row in regime_rows(rec)]
                continue
            rows.append(record_row(p, rec))
            bound = bound_row(rows[-1], rec)
            if bound:
                rows.append(bound)
    return pd.DataFrame(rows, columns=COLUMNS)


def busy_note(part: pd.DataFrame) -> list[str]:
    """One line per timing label naming its rows timed while other processes used more than BUSY_SHARE of the
    machine's CPUs: their tokens/s understate the machine (beside two busy loops on 2 cores llama.cpp decoded 16x
    slower, our engine 6x)."""
    from moespac.environment import BUSY_SHARE

    if "busy_share" not in part:
        return []
    busy = part[pd.to_numeric(part["busy_share"], errors="coerce") > BUSY_SHARE]
    out = []
    for timing, rows in busy.groupby("timing", sort=False):
        share = rows["busy_share"].astype(float)
        cells = "; ".join(f"{label} on {', '.join(dict.fromkeys(g['benchmark'].astype(str)))}"
                          for label, g in rows.groupby("label", sort=False))
        out.append(f"{timing} rows timed on a busy machine (other processes used {share.min():.0%}–{share.max():.0%} "
                   f"of the CPUs while they ran), so their tokens/s understate it: {cells}")
    return out
