# Helpers only (no rules): config validation, file names of every cell, the record lists of each study, and
# the final target list. The logic of each run lives in the `moespac` package; rules call its CLI.
import os
import re
from types import SimpleNamespace

import yaml
from shlex import quote  # every config value that reaches a shell goes through it (the schema restricts them too)

from moespac.analysis.outputs import OUTPUTS, lookup, names as output_names
from moespac.datasets import BENCHMARKS as KNOWN_BENCHMARKS, get_benchmark
from moespac.models.micro import ARCHS as MICRO_ARCHS
from moespac.registry import make_policy
from moespac.catalogue import get_method, k_method
from moespac.workflow_checks import check_limits, check_names, table3_choice, validate_config

# read through Snakemake's source cache: a deployed workflow's schema may be a remote file
with workflow.sourcecache.open(workflow.current_basedir.join("../schemas/config.schema.yaml")) as schema:
    validate_config(config, yaml.safe_load(schema))
check_names(
    config
)  # benchmark / method / policy / hardware / model-spec names, naming the key
check_limits(config)  # values that depend on each other (lengths against the pair's context, ...)

PAIRS = config["pairs"]
BENCHMARKS = config["benchmarks"]
PROMPTS = config["prompts"]
ENGINE = config["engine"]
LLAMACPP = config["wrapped"]["llamacpp"]
# the other wrapped systems: `moespac wrapped` command name -> config section (one Table 1 row each)
WRAPPED_SYSTEMS = {
    "accelerate": "accelerate",
    "vllm": "vllm",
    "moespac-release": "moespac_release",
}
# keys of those sections that become command options (null = the command's own default)
WRAPPED_OPTIONS = {
    "max_gpu_gib": "--max-gpu-gib",
    "max_cpu_gib": "--max-cpu-gib",
    "dtype": "--dtype",
    "cpu_offload_gb": "--cpu-offload-gb",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "gamma": "--draft-max",
}
SIM = config["simulation"]
SWEEPS = config["sweeps"]
FIGS = config["figures"]
WHATIF = config["whatif"]["locality"]
PAPER_REGIME = config["whatif"].get("paper_regime", {"activate": False})


def alternatives(names):
    """Regex matching exactly these names (and nothing when there are none)."""
    names = sorted(set(map(str, names)))
    return "|".join(re.escape(n) for n in names) if names else "(?!x)x"


def pairs_of(kind):
    return [name for name, p in PAIRS.items() if kind in p]


# ---- model pairs


def pair_ready(pair):
    """The file that exists once the pair is on disk (built here, or linked from the hub cache)."""
    if "target" in PAIRS[pair]:
        return f"resources/models/{pair}/linked.txt"
    return f"results/models/{pair}/target/config.json"


def pair_folder(pair):
    return (
        f"resources/models/{pair}"
        if "target" in PAIRS[pair]
        else f"results/models/{pair}"
    )


def get_pair_ready(wildcards):
    return pair_ready(wildcards.pair)


def derives_ar_trace(wildcards):
    """Whether this trace is the AR view of the pair's speculative trace (`simulation.ar_traces: derived`):
    batch 1, gamma 0, on a pair with a draft. No engine run, and its cells replay the speculative cells' tokens."""
    p = PAIRS[wildcards.pair]
    return (
        SIM.get("ar_traces", "derived") == "derived"
        and int(wildcards.gamma) == 0
        and int(wildcards.batch) == 1
        and "imported" not in p
        and ("target" not in p or "draft" in p)
    )


def get_trace_source(wildcards):
    """What a trace is made from: the pair's models, its speculative trace (a derived AR trace), or an imported
    pair's file of this benchmark."""
    p = PAIRS[wildcards.pair]
    if derives_ar_trace(wildcards):
        return trace_file(wildcards.pair, wildcards.benchmark, SIM["gamma"], 1, wildcards.tokens)
    if "imported" not in p:
        return pair_ready(wildcards.pair)
    files = {get_benchmark(b).name: path for b, path in p["imported"]["files"].items()}
    return files[wildcards.benchmark]


def get_trace_command(wildcards, input, output):
    """The engine run that records a trace, the AR view of a speculative one, or the import that turns a serving
    stack's routing into one."""
    p = PAIRS[wildcards.pair]
    if derives_ar_trace(wildcards):
        return (
            f"moespac derive-ar-trace {quote(input.source)} --out {quote(output.trace)} --json {quote(output.record)}"
        )
    if "imported" not in p:
        return (
            f"OMP_NUM_THREADS=1 moespac bench {get_model_args(wildcards)} --benchmark {quote(wildcards.benchmark)}"
            f" --policy all-host --cache-ratio 0 --gamma {wildcards.gamma} --batch-size {wildcards.batch}"
            f" --max-new-tokens {wildcards.tokens} {get_trace_limit(wildcards)} {get_prompt_args(wildcards)}"
            f" --warmup 0 --no-progress --trace {quote(output.trace)} --out {quote(output.record)}"
            + "".join(
                f" {flag}"
                for signal, flag in RECORDED_ON_REQUEST.items()
                if signal in SIGNALS_OF_TRACE.get(output.trace, ())
            )
        )
    imp = p["imported"]
    limit = "" if SIM["limit"] is None else f" --limit {SIM['limit']}"
    acceptance = "" if imp.get("acceptance") is None else f" --acceptance {imp['acceptance']}"
    return (
        f"moespac import-trace {quote(get_trace_source(wildcards))} --format {imp['format']}"
        f" --model-spec {quote(imp['model_spec'])} --model {quote(imp.get('model') or imp['model_spec'])}"
        f" --benchmark {quote(wildcards.benchmark)} --gamma {wildcards.gamma}{acceptance}{limit}"
        f" --max-new-tokens {wildcards.tokens} --out {quote(output.trace)} --json {quote(output.record)}"
    )


def get_model_args(wildcards):
    """How `moespac bench` names the models: hub ids as such (records keep them), else the pair's folder."""
    p = PAIRS[wildcards.pair]
    if "target" in p:
        draft = f" --draft {quote(p['draft'])}" if "draft" in p else ""  # no draft: a Table 3 pair planned only
        return f"--target {quote(p['target'])}{draft}"
    return f"--model-pair {quote(pair_folder(wildcards.pair))}"


def output_prefix(wildcards, output):
    """PREFIX of PREFIX.ext outputs (the report commands write every extension themselves)."""
    return os.path.splitext(output[0])[0]


def output_prefix_of_md(wildcards, output):
    return os.path.splitext(output.md)[0]


def models_of_input(wildcards, input):
    """results/models/NAME of an input NAME/target/config.json."""
    return os.path.dirname(os.path.dirname(input.target))


def get_pair_folder(wildcards):
    return pair_folder(wildcards.pair)


def get_build_args(wildcards):
    p = PAIRS[wildcards.pair]
    budget = f" --budget-minutes {p['build_minutes']}" if "build_minutes" in p else ""
    overrides = "".join(f" --set {quote(kv)}" for kv in p.get("build_set", []))
    return f"--config {p['build']}{budget}{overrides}"


def get_micro_arch(wildcards):
    return PAIRS[wildcards.pair]["micro"]


def get_hub_target(wildcards):
    return PAIRS[wildcards.pair]["target"]


def get_hub_draft(wildcards):
    return PAIRS[wildcards.pair].get("draft", "")


# ---- cell file names (wildcards in the file name; gamma 0 = autoregressive)


def fmt_ratio(x):
    return f"{float(x):g}"


def decode_gamma(method, gamma):
    return int(gamma) if get_method(method).draft else 0


# Each kind of cell has one path pattern, Paramspace's idea: the rule's output is the pattern (its wildcards),
# and the path a table asks for is the same pattern filled in (cell_path); nothing parses a path back.
CELLS = dict(
    trace="traces/{pair}/{benchmark}/g{gamma}-b{batch}-n{tokens}",
    simulated="simulated/{hardware}/{spec}/{draft}/{pair}/{benchmark}/{method}/g{gamma}-b{batch}-n{tokens}-c{cache}",
    measured="measured/{pair}/{benchmark}/{method}/g{gamma}-b{batch}-n{tokens}-c{cache}",
    llamacpp="wrapped/{pair}/{benchmark}/{method}/g{gamma}-n{tokens}",
    wrapped="wrapped/{pair}/{benchmark}/{system}/n{tokens}",
)


def cell_pattern(kind, folder=None, ext=".json"):
    """A cell kind's path pattern, with wildcards: under results/, or with its kind's folder swapped for
    `folder` (a rule's log or benchmark folder, e.g. 'results/logs/simulate_cell')."""
    top, rest = CELLS[kind].split("/", 1)
    base = folder or f"results/{top}"
    return f"{base}/{rest}{ext}"


def cell_path(kind, ext=".json", **values):
    """A cell's path: its kind's pattern filled in."""
    return cell_pattern(kind, ext=ext).format(**values)


def trace_file(pair, benchmark, gamma, batch, tokens):
    return cell_path("trace", ".npz", pair=pair, benchmark=benchmark, gamma=gamma, batch=batch, tokens=tokens)


def sim_draft(method, draft=None):
    """The draft spec whose cost a simulated cell charges ('none' for an autoregressive method)."""
    return (draft or SIM["draft_spec"]) if get_method(method).draft else "none"


# simulated cell -> the trace it replays, as sim_cell built both (never parsed back out of the path)
TRACE_OF_CELL = {}
# trace -> the signals some cell replaying it needs beyond the routing (moespac.policy.SIGNALS)
SIGNALS_OF_TRACE = {}
# signals the recording run makes only when asked (one more target pass per verify step), and the flag
RECORDED_ON_REQUEST = {"self_draft_topk": "--self-draft-lookahead"}


def sim_cell(
    method,
    benchmark,
    hardware=None,
    spec=None,
    pair=None,
    gamma=None,
    batch=None,
    tokens=None,
    cache=None,
    draft=None,
):
    """A simulated cell: hardware / target spec / draft spec / trace pair / ...; anything not given takes the
    `simulation` section's value. The draft is in the path so that changing it reruns its cells.
    """
    g = decode_gamma(method, SIM["gamma"] if gamma is None else gamma)
    pair, batch, tokens = pair or SIM["pair"], batch or SIM["batch_size"], tokens or SIM["max_new_tokens"]
    path = cell_path(
        "simulated",
        hardware=hardware or SIM["hardware"],
        spec=spec or SIM["model_spec"],
        draft=sim_draft(method, draft),
        pair=pair,
        benchmark=benchmark,
        method=method,
        gamma=g,
        batch=batch,
        tokens=tokens,
        cache=fmt_ratio(SIM["cache_ratio"] if cache is None else cache),
    )
    TRACE_OF_CELL[path] = trace_file(pair, benchmark, g, batch, tokens)
    SIGNALS_OF_TRACE.setdefault(TRACE_OF_CELL[path], set()).update(
        make_policy(get_method(method).policy).requires
    )
    return path


def measured_cell(method, benchmark, pair=None):
    """A measured cell with the `engine` section's settings (on its pair unless another is given)."""
    return cell_path(
        "measured",
        pair=pair or ENGINE["pair"],
        benchmark=benchmark,
        method=method,
        gamma=decode_gamma(method, ENGINE["gamma"]),
        batch=ENGINE["batch_size"],
        tokens=ENGINE["max_new_tokens"],
        cache=fmt_ratio(ENGINE["cache_ratio"]),
    )


def wrapped_cell(method, benchmark):
    return cell_path(
        "llamacpp",
        pair=LLAMACPP["pair"],
        benchmark=benchmark,
        method=method,
        gamma=decode_gamma(method, LLAMACPP["gamma"]),
        tokens=LLAMACPP["max_new_tokens"],
    )


def wrapped_system_cell(system, benchmark):
    s = config["wrapped"][WRAPPED_SYSTEMS[system]]
    return cell_path("wrapped", pair=s["pair"], benchmark=benchmark, system=system, tokens=s["max_new_tokens"])


def get_trace(wildcards):
    return trace_file(
        wildcards.pair,
        wildcards.benchmark,
        wildcards.gamma,
        wildcards.batch,
        wildcards.tokens,
    )


def get_profile_traces(wildcards):
    """The profiling run of a method that reads one (static placements, MoE-Infinity): the traces of the other
    benchmarks' prompts at the simulation's settings, never the replayed ones; none for other methods."""
    if not make_policy(get_method(wildcards.method).policy).uses_profile():
        return []
    gamma = SIM["gamma"] if int(wildcards.gamma) > 0 else 0
    return [
        trace_file(wildcards.pair, b, gamma, 1, SIM["max_new_tokens"])
        for b in BENCHMARKS
        if b != wildcards.benchmark
    ]


def get_profile_args(wildcards, input):
    return " ".join(f"--profile-trace {quote(p)}" for p in as_list(input.profile))


def get_draft_spec_arg(wildcards):
    return "" if wildcards.draft == "none" else f"--draft-spec {quote(wildcards.draft)}"


def get_policy(wildcards):
    return get_method(wildcards.method).policy


def get_bounds_flag(wildcards):
    """The oracle and infinite-cache bound cost several times a policy's own replay, and depend only on the
    trace: they are computed in the oracle's cells (Table 1's reference row), every other cell skips them.
    """
    return "" if get_policy(wildcards).split(":")[0] == "oracle" else "--no-bounds"


def get_limit(section):
    return "" if section["limit"] is None else f"--limit {section['limit']}"


def get_trace_limit(wildcards):
    """Prompts for `simulation.limit` requests (a prompt of T turns is T requests); a trace of batch b needs
    at least b prompts per call."""
    if SIM["limit"] is None:
        return ""
    prompts = -(-SIM["limit"] // get_benchmark(wildcards.benchmark).turns)
    return f"--limit {max(prompts, int(wildcards.batch))}"


def get_proxy_stats_args(wildcards):
    c = config["proxy_stats"]
    return (
        f"--benchmarks {','.join(BENCHMARKS)} --prompts {c['prompts']} --max-new-tokens {c['max_new_tokens']}"
        f" --gamma {c['gamma']} --seed {PROMPTS['seed']} --temperature {PROMPTS['temperature']}"
    )


def sampling_args():
    """The `prompts` section's decoding flags, as the engine and every wrapped system take them."""
    eos = " --ignore-eos" if PROMPTS["ignore_eos"] else ""
    return f"{eos} --temperature {PROMPTS['temperature']}"


def get_prompt_args(wildcards):
    return f"--source {PROMPTS['source']} --seed {PROMPTS['seed']}{sampling_args()}"


def get_llamacpp_args(wildcards):
    draft = (
        f" --draft --draft-max {wildcards.gamma}"
        if get_method(wildcards.method).draft
        else ""
    )
    limit = (
        1000000 if LLAMACPP["limit"] is None else LLAMACPP["limit"]
    )  # 'all' for the wrapper
    return f"--limit {limit} --seed {PROMPTS['seed']}{draft}{sampling_args()}"


def get_wrapped_args(wildcards, threads):
    """`moespac wrapped SYSTEM` options from its config section (limit null: every prompt)."""
    s = config["wrapped"][WRAPPED_SYSTEMS[wildcards.system]]
    limit = 1000000 if s["limit"] is None else s["limit"]
    args = [f"--limit {limit} --seed {PROMPTS['seed']}{sampling_args()}"]
    args += [
        f"{flag} {quote(str(s[k]))}" for k, flag in WRAPPED_OPTIONS.items() if s.get(k) is not None
    ]
    if wildcards.system == "moespac-release":
        args.append(f"--threads {threads}")
    return " ".join(args)


# ---- the record list of each study (tables and figures read these; MLflow files runs by study)


def table1_records():
    out = [sim_cell(m, b) for m in config["table1"]["methods"] for b in BENCHMARKS]
    if ENGINE["activate"]:
        out += [measured_cell(m, b) for m in ENGINE["methods"] for b in BENCHMARKS]
    if LLAMACPP["activate"]:
        out += [wrapped_cell(m, b) for m in LLAMACPP["methods"] for b in BENCHMARKS]
    for system, section in WRAPPED_SYSTEMS.items():
        if config["wrapped"][section]["activate"]:
            out += [wrapped_system_cell(system, b) for b in BENCHMARKS]
    return out


def table2_records():
    t = config["table2"]
    return [sim_cell(m, b) for m in t["methods"] for b in t["benchmarks"]]


# Table 3 entry (its index) -> (the pair whose traces it replays, why): a hub pair's memory plan on this
# machine decides an entry with a fallback_pair, once per run of Snakemake (configs only, no weights)
TABLE3_PAIRS = {}


def table3_pair(i, entry):
    """The pair whose traces Table 3 entry `i` replays: its `pair`, or with a `fallback_pair` the choice that
    the memory plan of `pair` on this machine makes (moespac.workflow_checks.table3_choice, said in the log)."""
    if "fallback_pair" not in entry:
        return entry.get("pair")
    if i not in TABLE3_PAIRS:
        from moespac.engine.session import EngineConfig, plan_verdict, resolve_device

        p = PAIRS[entry["pair"]]  # planned as its traces are recorded: every expert on the host (no slots)
        cfg = EngineConfig(target=p["target"], draft=p.get("draft"), cache_ratio=0.0, gamma=SIM["gamma"],
                           batch_size=SIM["batch_size"])
        verdict = plan_verdict(cfg, resolve_device(None))[1]
        needs_draft = any(get_method(m).draft for m in config["table3"]["methods"])
        TABLE3_PAIRS[i] = table3_choice(entry, verdict, PAIRS, needs_draft)
        logger.info(f"table3.models[{i}] ({entry['spec']}): traces of {TABLE3_PAIRS[i][0]}: {TABLE3_PAIRS[i][1]}")
    return TABLE3_PAIRS[i][0]


def table3_records():
    """Simulated cells per model entry (its draft_spec, else the simulation's); measured ones too where the
    entry's own pair is traced and `measure`."""
    t, out = config["table3"], []
    for i, e in enumerate(t["models"]):
        pair = table3_pair(i, e)
        for m in t["methods"]:
            for b in t["benchmarks"]:
                out.append(
                    sim_cell(
                        m,
                        b,
                        hardware=e["hardware"],
                        spec=e["spec"],
                        pair=pair,
                        draft=e.get("draft_spec"),
                    )
                )
                if e.get("measure") and pair == e["pair"]:
                    out.append(measured_cell(m, b, pair=e["pair"]))
    return out


def table4_records():
    t = config["table4"]
    return [
        sim_cell("moespac", t["benchmark"], gamma=g, batch=b)
        for b in t["batch_sizes"]
        for g in t["gammas"]
    ]


# the sim_cell setting each sweep varies (K varies the method: MoE-SpAc's utility bound is a policy option)
SWEEP_SETTING = {"cache_ratio": "cache", "draft_cache": "cache", "gen_length": "tokens", "batch": "batch"}


def sweep_records(name):
    s = SWEEPS[name]
    if name == "K":
        return [sim_cell(k_method(v, m), s["benchmark"]) for m in s["methods"] for v in s["values"]]
    return [sim_cell(m, s["benchmark"], **{SWEEP_SETTING[name]: v}) for m in s["methods"] for v in s["values"]]


def study_traces(benchmarks, draft=True):
    """Traces of the `simulation` settings (with the draft, or autoregressive) for these benchmarks."""
    g = SIM["gamma"] if draft else 0
    return [
        trace_file(SIM["pair"], b, g, SIM["batch_size"], SIM["max_new_tokens"])
        for b in benchmarks
    ]


def active(section):
    return config[section]["activate"]


def study_records(name):
    """The record files of one study (none when its config section is off)."""
    if name.startswith("sweep_"):
        sweep = name.removeprefix("sweep_")
        return sweep_records(sweep) if SWEEPS[sweep]["activate"] else []
    if name != "table1" and not active(name):
        return []
    return {
        "table1": table1_records,
        "table2": table2_records,
        "table3": table3_records,
        "table4": table4_records,
    }[name]()


def studies():
    """{study name: record files} of every study that runs; a record may serve several studies."""
    names = ["table1", "table2", "table3", "table4"] + [f"sweep_{s}" for s in SWEEPS]
    out = {n: study_records(n) for n in names}
    out = {n: files for n, files in out.items() if files or n == "table1"}
    cells = [c for records in out.values() for c in records]
    traces = {TRACE_OF_CELL[c] for c in cells if c.startswith("results/simulated/")} | set(traces_used())
    # the engine runs that recorded them (a derived AR trace's record is no run: it is left out)
    out["traces"] = sorted(t.replace(".npz", ".json") for t in traces if not derives_ar_trace(trace_wildcards(t)))
    return out


def trace_wildcards(path):
    """The wildcards of a trace file's path (CELLS['trace'])."""
    pair, benchmark, name = path.split("/")[-3:]
    gamma, batch, tokens = re.fullmatch(r"g(\d+)-b(\d+)-n(\d+)\.npz", name).groups()
    return SimpleNamespace(pair=pair, benchmark=benchmark, gamma=gamma, batch=batch, tokens=tokens)


def traces_used():
    """Every trace file the figures read directly."""
    benchmarks = FIGS["fig4_benchmarks"] + [FIGS["heatmap_benchmark"]]
    return study_traces(benchmarks) + study_traces(benchmarks, draft=False)


def source_files(source):
    """The files an output's input source names (moespac/analysis/outputs.py: study:, traces:, file:)."""
    kind, _, rest = source.partition(":")
    if kind == "study":
        return study_records(rest)
    if kind == "traces":
        key, mode = rest.rsplit(":", 1)
        return study_traces(as_list(lookup(config, key)), draft=mode == "sd")
    return [rest]


def get_output_inputs(wildcards):
    """{group: files} of the paper table or figure the job builds."""
    name = getattr(wildcards, "table", None) or wildcards.figure
    return {g: source_files(src) for g, src in OUTPUTS[name].inputs.items()}


def get_figure_groups(wildcards, input):
    args = [" ".join(["--group", name, *as_list(input[name])]) for name in input.keys()]
    for group, key in OUTPUTS[wildcards.figure].settings.items():
        args.append(f"--group {group} {quote(str(lookup(config, key)))}")
    return " ".join(args)


def get_tracking_inputs(wildcards):
    """Every study's records, the overhead record, and the tables and figures (logged as artifacts)."""
    inputs = dict(studies())
    inputs["overhead"] = ["results/overhead/scheduler.json"]
    if config["smoke"]["activate"]:
        inputs["smoke"] = expand(
            "results/smoke/generate/{arch}.json", arch=config["smoke"]["archs"]
        )
    inputs["outputs"] = final_paper_outputs()
    return inputs


def as_list(files):
    return [files] if isinstance(files, str) else list(files)


def get_study_args(wildcards, input):
    names = [n for n in input.keys() if n != "outputs" and as_list(input[n])]
    return " ".join(" ".join(["--study", n, *as_list(input[n])]) for n in names)


# ---- outputs


def table_names():
    return [n for n in output_names("table") if OUTPUTS[n].active(config)]


def figure_names():
    return [n for n in output_names("figure") if OUTPUTS[n].active(config)]


def get_audit_tables(wildcards):
    """What the audit compares with the paper's claims: Table 1, and Tables 2-4, App. A.1 and the paper-regime
    record when they run."""
    tables = {"table1": "paper_figs/table1.csv"}
    for name in ("table2", "table3", "table4", "appendix_a1"):
        if name in table_names():
            tables[name] = f"paper_figs/{name}.csv"
    if PAPER_REGIME["activate"]:
        tables["paper_regime"] = "results/whatif/paper_regime.json"
    return tables


def get_routing_stats_traces(wildcards):
    """{label: trace}: the simulated pair's traces of every benchmark, with the draft and without."""
    out = {}
    for draft in (True, False):
        for b, path in zip(BENCHMARKS, study_traces(BENCHMARKS, draft)):
            out[f"{SIM['pair']} {b} {'SD' if draft else 'AR'}"] = path
    return out


def get_routing_stats_args(wildcards, input):
    traces = " ".join(quote(f"--trace={label}={path}") for label, path in input.items())
    skews = (
        f" --skews {','.join(str(s) for s in WHATIF['skews'])}" if WHATIF["activate"] else ""
    )
    return (
        f"{traces}{skews} --hardware {quote(SIM['hardware'])} --model-spec {quote(SIM['model_spec'])}"
        f" --cache-ratio {SIM['cache_ratio']}"
    )


def get_audit_args(wildcards, input):
    return " ".join(f"--{name.replace('_', '-')} {quote(path)}" for name, path in input.items())


def final_paper_outputs():
    out = expand(
        "paper_figs/{table}.{ext}", table=table_names(), ext=["csv", "md", "tex", "html"]
    )
    out += expand(
        "paper_figs/{figure}.{ext}", figure=figure_names(), ext=["png", "pdf"]
    )
    if WHATIF["activate"]:
        out += expand("paper_figs/whatif_locality.{ext}", ext=["csv", "md", "png", "pdf"])
    if PAPER_REGIME["activate"]:
        out += expand("paper_figs/{page}.{ext}", page=["paper_regime", "consistency"], ext=["csv", "md", "png", "pdf"])
    out += expand("paper_figs/routing_stats.{ext}", ext=["csv", "md", "tex", "html"])
    return out + ["paper_figs/audit.md"]


def get_whatif_traces(wildcards):
    """The simulation pair's recorded SD and AR traces of the what-if's benchmark (Table 1's own)."""
    sd = trace_file(
        SIM["pair"],
        WHATIF["benchmark"],
        SIM["gamma"],
        SIM["batch_size"],
        SIM["max_new_tokens"],
    )
    ar = trace_file(
        SIM["pair"], WHATIF["benchmark"], 0, SIM["batch_size"], SIM["max_new_tokens"]
    )
    return dict(sd=sd, ar=ar)


def get_whatif_options(wildcards):
    return (
        f"--skews {','.join(f'{float(s):g}' for s in WHATIF['skews'])} "
        f"--methods {','.join(WHATIF['methods'])} --tokens {WHATIF['tokens']} "
        f"--hardware {SIM['hardware']} --model-spec {SIM['model_spec']} "
        f"--draft-spec {SIM['draft_spec']} --cache-ratio {SIM['cache_ratio']}"
    )


def get_paper_regime_options(wildcards):
    return (
        f"--methods {','.join(config['table1']['methods'])} --benchmarks {','.join(BENCHMARKS)}"
        f" --hardware {quote(SIM['hardware'])} --model-spec {quote(SIM['model_spec'])}"
        f" --draft-spec {quote(SIM['draft_spec'])} --cache-ratio {SIM['cache_ratio']} --gamma {SIM['gamma']}"
        f" --requests {PAPER_REGIME['requests']} --new-tokens {PAPER_REGIME['new_tokens']}"
        + ("" if PAPER_REGIME.get("infer_host", True) else " --no-infer-host")
        + ("" if PAPER_REGIME.get("sweep", True) else " --no-sweep")
    )


def output_sources():
    """Every record and trace the paper outputs read. They are targets themselves: in a clean clone the
    committed outputs exist while their sources do not, and Snakemake does not rebuild a missing input of an
    output that exists (Table 6 was left stale that way when nothing else asked for results/smoke/numerics.json).
    """
    out = [c for records in studies().values() for c in records]
    out += ["results/overhead/scheduler.json", "results/smoke/numerics.json"]
    out += traces_used()
    if WHATIF["activate"]:
        out += list(get_whatif_traces(None).values())
    if PAPER_REGIME["activate"]:
        out.append("results/whatif/paper_regime.json")
    return sorted(set(out))


def get_final_output():
    out = final_paper_outputs() + output_sources()
    if config["proxy_stats"]["activate"]:
        out += expand(
            "paper_figs/proxy_stats_{pair}.md", pair=config["proxy_stats"]["pairs"]
        )
    if config["smoke"]["activate"]:
        archs = config["smoke"]["archs"]
        out += expand("results/smoke/lossless/{arch}.txt", arch=archs)
        out += expand("results/smoke/generate/{arch}.json", arch=archs)
    if config["tracking"]["activate"]:
        out.append("results/mlflow/ingest.json")
    return out


wildcard_constraints:
    # paper tables and figures only: paper_figs/ also holds what-if and proxy-stats outputs of other rules
    table=alternatives(output_names("table")),
    figure=alternatives(output_names("figure")),
    pair=alternatives(PAIRS),
    benchmark=alternatives(KNOWN_BENCHMARKS),
    method="[a-z0-9-]+",
    gamma=r"\d+",
    batch=r"\d+",
    tokens=r"\d+",
    cache=r"[0-9.]+",
    hardware="[a-z0-9.-]+",
    spec="[a-z0-9.-]+",
    draft="[a-z0-9.-]+",
