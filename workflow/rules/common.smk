# Helpers only (no rules): config validation and the rules' lookups. Which files a config asks for (every cell,
# each study's records, the final targets) is decided by moespac/study_plan.py; each run's logic lives in the
# `moespac` package, and rules call its CLI.
import os
import re

import yaml
from shlex import quote  # every config value that reaches a shell goes through it (the schema restricts them too)

from moespac.analysis.outputs import OUTPUTS, lookup, names as output_names
from moespac.catalogue import get_method
from moespac.datasets import BENCHMARKS as KNOWN_BENCHMARKS, get_benchmark
from moespac.models.micro import ARCHS as MICRO_ARCHS
from moespac.study_plan import (
    PAPER_REGIME_RECORD,
    RECORDED_ON_REQUEST,
    WRAPPED_SYSTEMS,
    StudyPlan,
    as_list,
    cell_pattern,
)
from moespac.workflow_checks import check_limits, check_names, table3_choice, validate_config

# read through Snakemake's source cache: a deployed workflow's schema may be a remote file
with workflow.sourcecache.open(workflow.current_basedir.join("../schemas/config.schema.yaml")) as schema:
    validate_config(config, yaml.safe_load(schema))
check_names(config)  # benchmark / method / policy / hardware / model-spec names, naming the key
check_limits(config)  # values that depend on each other (lengths against the pair's context, ...)

PAIRS = config["pairs"]
BENCHMARKS = config["benchmarks"]
PROMPTS = config["prompts"]
ENGINE = config["engine"]
LLAMACPP = config["wrapped"]["llamacpp"]
# keys of the wrapped systems' sections that become command options (null = the command's own default)
WRAPPED_OPTIONS = {
    "max_gpu_gib": "--max-gpu-gib",
    "max_cpu_gib": "--max-cpu-gib",
    "dtype": "--dtype",
    "cpu_offload_gb": "--cpu-offload-gb",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "gamma": "--draft-max",
}
SIM = config["simulation"]
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


def output_folder_of_traces(wildcards, output):
    """The folder the paper-regime job writes its traces to: its first speculative trace's."""
    return os.path.dirname(output.sd[0])


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


# ---- the study's files: moespac/study_plan.py decides them; these are the rules' lookups into it


def plan_table3_pair(i, entry):
    """A Table 3 entry with a fallback_pair: the memory plan of its hub pair on this machine decides (from the
    configs alone, every expert on the host as its traces are recorded; said in the log). Only such entries
    (config/paper.yaml) load the engine while the DAG is built; the default config has none."""
    from moespac.engine.session import EngineConfig, plan_verdict, resolve_device

    p = PAIRS[entry["pair"]]
    cfg = EngineConfig(target=p["target"], draft=p.get("draft"), cache_ratio=0.0, gamma=SIM["gamma"],
                       batch_size=SIM["batch_size"])
    needs_draft = any(get_method(m).draft for m in config["table3"]["methods"])
    pair, why = table3_choice(entry, plan_verdict(cfg, resolve_device(None))[1], PAIRS, needs_draft)
    logger.info(f"table3.models[{i}] ({entry['spec']}): traces of {pair}: {why}")
    return pair


PLAN = StudyPlan(config, table3_pair=plan_table3_pair)
# how a pair's traces are made: the engine records them (record_trace), an `imported` pair's file is converted
# (import_trace), and a batch-1 AR trace of a pair with a draft is by default derived from its speculative one
# (derive_ar_trace)
IMPORTED_PAIRS = pairs_of("imported")
RECORDED_PAIRS = [name for name in PAIRS if name not in IMPORTED_PAIRS]
DERIVED_AR_PAIRS = PLAN.derived_ar_pairs()


def get_trace(wildcards):
    return PLAN.trace_file(wildcards.pair, wildcards.benchmark, wildcards.gamma, wildcards.batch, wildcards.tokens)


def get_speculative_trace(wildcards):
    """The speculative trace whose kept tokens a derived AR trace replays."""
    return PLAN.trace_file(wildcards.pair, wildcards.benchmark, SIM["gamma"], 1, wildcards.tokens)


def get_imported_file(wildcards):
    files = {get_benchmark(b).name: path for b, path in PAIRS[wildcards.pair]["imported"]["files"].items()}
    return files[wildcards.benchmark]


def get_import_args(wildcards):
    imp = PAIRS[wildcards.pair]["imported"]
    args = [f"--format {imp['format']} --model-spec {quote(imp['model_spec'])}",
            f"--model {quote(imp.get('model') or imp['model_spec'])}"]
    args += [] if imp.get("acceptance") is None else [f"--acceptance {imp['acceptance']}"]
    args += [] if SIM["limit"] is None else [f"--limit {SIM['limit']}"]
    return " ".join(args)


def get_recorded_signals(wildcards, output):
    """The flags of the signals a cell replaying this trace needs that the engine makes only when asked."""
    wanted = PLAN.signals_of.get(output.trace, ())
    return " ".join(flag for signal, flag in RECORDED_ON_REQUEST.items() if signal in wanted)


def get_trace_limit(wildcards):
    n = PLAN.trace_limit(wildcards.benchmark, wildcards.batch)
    return "" if n is None else f"--limit {n}"


def get_profile_traces(wildcards):
    return PLAN.profile_traces(wildcards.method, wildcards.benchmark, wildcards.pair, wildcards.gamma)


def get_profile_args(wildcards, input):
    return " ".join(f"--profile-trace {quote(p)}" for p in as_list(input.profile))


def get_draft_spec_arg(wildcards):
    return "" if wildcards.draft == "none" else f"--draft-spec {quote(wildcards.draft)}"


def get_bounds_flag(wildcards):
    """The oracle and infinite-cache bound cost several times a policy's own replay, and depend only on the
    trace: they are computed in the oracle's cells (Table 1's reference row), every other cell skips them."""
    return "" if get_method(wildcards.method).policy.split(":")[0] == "oracle" else "--no-bounds"


def get_limit(section):
    return "" if section["limit"] is None else f"--limit {section['limit']}"


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
    draft = f" --draft --draft-max {wildcards.gamma}" if get_method(wildcards.method).draft else ""
    limit = 1000000 if LLAMACPP["limit"] is None else LLAMACPP["limit"]  # 'all' for the wrapper
    return f"--limit {limit} --seed {PROMPTS['seed']}{draft}{sampling_args()}"


def get_wrapped_args(wildcards, threads):
    """`moespac wrapped SYSTEM` options from its config section (limit null: every prompt)."""
    s = config["wrapped"][WRAPPED_SYSTEMS[wildcards.system]]
    limit = 1000000 if s["limit"] is None else s["limit"]
    args = [f"--limit {limit} --seed {PROMPTS['seed']}{sampling_args()}"]
    args += [f"{flag} {quote(str(s[k]))}" for k, flag in WRAPPED_OPTIONS.items() if s.get(k) is not None]
    if wildcards.system == "moespac-release":
        args.append(f"--threads {threads}")
    return " ".join(args)


def get_output_inputs(wildcards):
    """{group: files} of the paper table or figure the job builds."""
    name = getattr(wildcards, "table", None) or wildcards.figure
    return {g: PLAN.source_files(src) for g, src in OUTPUTS[name].inputs.items()}


def get_figure_groups(wildcards, input):
    args = [" ".join(["--group", name, *as_list(input[name])]) for name in input.keys()]
    for group, key in OUTPUTS[wildcards.figure].settings.items():
        args.append(f"--group {group} {quote(str(lookup(config, key)))}")
    return " ".join(args)


def get_tracking_inputs(wildcards):
    """Every study's records, the overhead record, and the tables and figures (logged as artifacts)."""
    inputs = dict(PLAN.studies)
    inputs["overhead"] = ["results/overhead/scheduler.json"]
    if config["smoke"]["activate"]:
        inputs["smoke"] = expand("results/smoke/generate/{arch}.json", arch=config["smoke"]["archs"])
    inputs["outputs"] = PLAN.final_paper_outputs()
    return inputs


def get_study_args(wildcards, input):
    names = [n for n in input.keys() if n != "outputs" and as_list(input[n])]
    return " ".join(" ".join(["--study", n, *as_list(input[n])]) for n in names)


def get_audit_tables(wildcards):
    """What the audit compares with the paper's claims: Table 1, and Tables 2-4, App. A.1 and the paper-regime
    record when they run."""
    tables = {"table1": "paper_figs/table1.csv"}
    for name in ("table2", "table3", "table4", "appendix_a1"):
        if name in PLAN.output_names("table"):
            tables[name] = f"paper_figs/{name}.csv"
    if PAPER_REGIME["activate"]:
        tables["paper_regime"] = PAPER_REGIME_RECORD
    return tables


def get_routing_stats_traces(wildcards):
    """{label: trace}: the simulated pair's traces of every benchmark, with the draft and without, then the
    paper-regime study's speculative ones (the routing it replays, fitted to App. A.1) when it runs."""
    out = {}
    for draft in (True, False):
        for b, path in zip(BENCHMARKS, PLAN.study_traces(BENCHMARKS, draft)):
            out[f"{SIM['pair']} {b} {'SD' if draft else 'AR'}"] = path
    if PAPER_REGIME["activate"]:
        out.update({f"paper-regime {b} SD": path for b, path in PLAN.paper_regime_traces().items()})
    return out


def get_routing_stats_args(wildcards, input):
    traces = " ".join(quote(f"--trace={label}={path}") for label, path in input.items())
    skews = f" --skews {','.join(str(s) for s in WHATIF['skews'])}" if WHATIF["activate"] else ""
    return (
        f"{traces}{skews} --hardware {quote(SIM['hardware'])} --model-spec {quote(SIM['model_spec'])}"
        f" --cache-ratio {SIM['cache_ratio']}"
    )


def get_audit_args(wildcards, input):
    return " ".join(f"--{name.replace('_', '-')} {quote(path)}" for name, path in input.items())


def get_whatif_traces(wildcards):
    return PLAN.whatif_traces()


def get_whatif_options(wildcards):
    return (
        f"--skews {','.join(f'{float(s):g}' for s in WHATIF['skews'])} "
        f"--methods {','.join(WHATIF['methods'])} --tokens {WHATIF['tokens']} "
        f"--hardware {SIM['hardware']} --model-spec {SIM['model_spec']} "
        f"--draft-spec {SIM['draft_spec']} --cache-ratio {SIM['cache_ratio']}"
    )


def get_paper_regime_options(wildcards):
    table4 = PAPER_REGIME.get("table4") if PLAN.active("table4") else None
    return (
        f"--methods {','.join(config['table1']['methods'])} --benchmarks {','.join(BENCHMARKS)}"
        f" --hardware {quote(SIM['hardware'])} --model-spec {quote(SIM['model_spec'])}"
        f" --draft-spec {quote(SIM['draft_spec'])} --cache-ratio {SIM['cache_ratio']} --gamma {SIM['gamma']}"
        f" --requests {PAPER_REGIME['requests']} --new-tokens {PAPER_REGIME['new_tokens']}"
        + ("" if PAPER_REGIME.get("infer_host", True) else " --no-infer-host")
        + ("" if PAPER_REGIME.get("sweep", True) else " --no-sweep")
        + (f" --table2-methods {','.join(config['table2']['methods'])}"
           f" --table2-benchmarks {','.join(config['table2']['benchmarks'])}" if PLAN.active("table2") else "")
        + (f" --table4-benchmark {quote(config['table4']['benchmark'])}"
           f" --table4-batch-sizes {','.join(map(str, table4['batch_sizes']))}"
           f" --table4-gammas {','.join(map(str, table4['gammas']))}" if table4 else "")
    )


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
