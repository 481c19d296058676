"""Which files a workflow config asks for: every cell's path, the trace each simulated cell replays, the record
list of each study and the final targets. Pure: it reads the config and the catalogue, never a file, a model or
the engine; the Snakemake rules ask it (workflow/rules/common.smk holds one StudyPlan) and tests call it directly.

A cell's path is its kind's pattern filled in (Paramspace's idea): the rule's output is the pattern, a table asks
for the filled-in path, and what a path stands for is kept when it is made (`trace_key`), never parsed back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from moespac.analysis.outputs import OUTPUTS, lookup, names as output_names
from moespac.catalogue import get_method, k_method
from moespac.datasets import get_benchmark
from moespac.registry import make_policy
from moespac.sim.paper_routing import trace_name

CELLS = dict(
    trace="traces/{pair}/{benchmark}/g{gamma}-b{batch}-n{tokens}",
    simulated="simulated/{hardware}/{spec}/{draft}/{pair}/{benchmark}/{method}/g{gamma}-b{batch}-n{tokens}-c{cache}",
    measured="measured/{pair}/{benchmark}/{method}/g{gamma}-b{batch}-n{tokens}-c{cache}",
    llamacpp="wrapped/{pair}/{benchmark}/{method}/g{gamma}-n{tokens}",
    wrapped="wrapped/{pair}/{benchmark}/{system}/n{tokens}",
)
"""One path pattern per kind of cell, under results/ (wildcards in braces)."""

PAPER_REGIME_RECORD = "results/whatif/paper_regime.json"
PAPER_REGIME_TRACES = "results/traces/paper-regime"
"""The paper-regime study's traces (`moespac report paper-regime --traces`): BENCHMARK-gGAMMA.npz and BENCHMARK-ar.npz,
the names `moespac fit-routing --traces` writes."""
SWEEP_SETTING = {"cache_ratio": "cache", "draft_cache": "cache", "gen_length": "tokens", "batch": "batch"}
"""The cell setting each sweep varies (K varies the method: MoE-SpAc's utility bound is a policy option)."""
RECORDED_ON_REQUEST = {"self_draft_topk": "--self-draft-lookahead"}
"""Signals a recording run makes only when asked (one more target pass per verify step), and the flag."""


def cell_pattern(kind: str, folder: str | None = None, ext: str = ".json") -> str:
    """A cell kind's path pattern, with wildcards: under results/, or with its kind's folder swapped for `folder`
    (a rule's log or benchmark folder, e.g. 'results/logs/simulate_cell')."""
    top, rest = CELLS[kind].split("/", 1)
    return f"{folder or f'results/{top}'}/{rest}{ext}"


def cell_path(kind: str, ext: str = ".json", **values) -> str:
    """A cell's path: its kind's pattern filled in."""
    return cell_pattern(kind, ext=ext).format(**values)


def fmt_ratio(x) -> str:
    return f"{float(x):g}"


def decode_gamma(method: str, gamma) -> int:
    """The draft length a method decodes with: 0 (autoregressive) for a method without a draft."""
    return int(gamma) if get_method(method).draft else 0


@dataclass(frozen=True)
class TraceKey:
    """What a trace file is: the pair, benchmark and settings its path was made from."""

    pair: str
    benchmark: str
    gamma: int
    batch: int
    tokens: int


class StudyPlan:
    """The files of one workflow config. `table3_pair(i, entry)` decides a Table 3 entry with a `fallback_pair`
    (the workflow passes one that plans the hub pair on this machine); without one, such an entry is refused."""

    def __init__(self, config: dict, table3_pair: Callable[[int, dict], str] | None = None):
        self.config = config
        self.sim = config["simulation"]
        self._table3_pair = table3_pair
        self.trace_of: dict[str, str] = {}
        """simulated cell -> the trace it replays"""
        self.signals_of: dict[str, set[str]] = {}
        """trace -> the signals some cell replaying it needs beyond the routing (moespac.policy.SIGNALS)"""
        self.trace_key: dict[str, TraceKey] = {}
        """trace -> what it is"""
        self.studies = self._studies()
        """{study: record files} of every study that runs, and 'traces': the engine runs that recorded them"""

    # ---- cells

    def trace_file(self, pair, benchmark, gamma, batch, tokens) -> str:
        path = cell_path("trace", ".npz", pair=pair, benchmark=benchmark, gamma=gamma, batch=batch, tokens=tokens)
        self.trace_key[path] = TraceKey(str(pair), str(benchmark), int(gamma), int(batch), int(tokens))
        return path

    def sim_draft(self, method: str, draft=None) -> str:
        """The draft spec whose cost a simulated cell charges ('none' for an autoregressive method)."""
        return (draft or self.sim["draft_spec"]) if get_method(method).draft else "none"

    def sim_cell(self, method, benchmark, hardware=None, spec=None, pair=None, gamma=None, batch=None, tokens=None,
                 cache=None, draft=None) -> str:
        """A simulated cell: hardware / target spec / draft spec / trace pair / ...; anything not given takes the
        `simulation` section's value. The draft is in the path so that changing it reruns its cells."""
        s = self.sim
        g = decode_gamma(method, s["gamma"] if gamma is None else gamma)
        pair, batch, tokens = pair or s["pair"], batch or s["batch_size"], tokens or s["max_new_tokens"]
        path = cell_path("simulated", hardware=hardware or s["hardware"], spec=spec or s["model_spec"],
                         draft=self.sim_draft(method, draft), pair=pair, benchmark=benchmark, method=method, gamma=g,
                         batch=batch, tokens=tokens, cache=fmt_ratio(s["cache_ratio"] if cache is None else cache))
        trace = self.trace_of[path] = self.trace_file(pair, benchmark, g, batch, tokens)
        self.signals_of.setdefault(trace, set()).update(make_policy(get_method(method).policy).requires)
        return path

    def measured_cell(self, method, benchmark, pair=None) -> str:
        """A measured cell with the `engine` section's settings (on its pair unless another is given)."""
        e = self.config["engine"]
        return cell_path("measured", pair=pair or e["pair"], benchmark=benchmark, method=method,
                         gamma=decode_gamma(method, e["gamma"]), batch=e["batch_size"], tokens=e["max_new_tokens"],
                         cache=fmt_ratio(e["cache_ratio"]))

    def llamacpp_cell(self, method, benchmark) -> str:
        w = self.config["wrapped"]["llamacpp"]
        return cell_path("llamacpp", pair=w["pair"], benchmark=benchmark, method=method,
                         gamma=decode_gamma(method, w["gamma"]), tokens=w["max_new_tokens"])

    def wrapped_system_cell(self, system: str, benchmark) -> str:
        s = self.config["wrapped"][WRAPPED_SYSTEMS[system]]
        return cell_path("wrapped", pair=s["pair"], benchmark=benchmark, system=system, tokens=s["max_new_tokens"])

    def derived_ar_pairs(self) -> list[str]:
        """The pairs whose batch-1 AR traces are the AR view of their speculative ones (`simulation.ar_traces:
        derived`): a pair with a draft, not imported. No engine run; their cells replay the speculative tokens."""
        if self.sim.get("ar_traces", "derived") != "derived":
            return []
        return [name for name, p in self.config["pairs"].items()
                if "imported" not in p and ("target" not in p or "draft" in p)]

    def derives_ar_trace(self, key: TraceKey) -> bool:
        return key.gamma == 0 and key.batch == 1 and key.pair in self.derived_ar_pairs()

    def study_traces(self, benchmarks, draft: bool = True) -> list[str]:
        """Traces of the `simulation` settings (with the draft, or autoregressive) for these benchmarks."""
        s = self.sim
        return [self.trace_file(s["pair"], b, s["gamma"] if draft else 0, s["batch_size"], s["max_new_tokens"])
                for b in benchmarks]

    # ---- the record list of each study (tables and figures read these; MLflow files runs by study)

    def active(self, section: str) -> bool:
        return self.config[section]["activate"]

    def paper_regime_record(self) -> list[str]:
        """The paper-regime study's record, when it runs: Tables 1, 2 and 4 show its cells as a block of their own."""
        regime = self.config["whatif"].get("paper_regime", {"activate": False})
        return [PAPER_REGIME_RECORD] if regime["activate"] else []

    def paper_regime_traces(self, draft: bool = True) -> dict[str, str]:
        """{benchmark: the paper-regime study's trace} (speculative at simulation.gamma, or autoregressive): the
        traces its cells replay, written beside its record so the routing-stats page can read them."""
        return {b: f"{PAPER_REGIME_TRACES}/{trace_name(b, self.sim['gamma'], ar=not draft)}"
                for b in self.config["benchmarks"]}

    def table1_records(self) -> list[str]:
        c, benchmarks = self.config, self.config["benchmarks"]
        out = [self.sim_cell(m, b) for m in c["table1"]["methods"] for b in benchmarks]
        if c["engine"]["activate"]:
            out += [self.measured_cell(m, b) for m in c["engine"]["methods"] for b in benchmarks]
        if c["wrapped"]["llamacpp"]["activate"]:
            out += [self.llamacpp_cell(m, b) for m in c["wrapped"]["llamacpp"]["methods"] for b in benchmarks]
        for system, section in WRAPPED_SYSTEMS.items():
            if c["wrapped"][section]["activate"]:
                out += [self.wrapped_system_cell(system, b) for b in benchmarks]
        return out + self.paper_regime_record()

    def table2_records(self) -> list[str]:
        t = self.config["table2"]
        return [self.sim_cell(m, b) for m in t["methods"] for b in t["benchmarks"]] + self.paper_regime_record()

    def table3_records(self) -> list[str]:
        """Simulated cells per model entry (its draft_spec, else the simulation's); measured ones too where the
        entry's own pair is traced and `measure`."""
        t, out = self.config["table3"], []
        for i, e in enumerate(t["models"]):
            pair = self.table3_pair(i, e)
            for m in t["methods"]:
                for b in t["benchmarks"]:
                    out.append(self.sim_cell(m, b, hardware=e["hardware"], spec=e["spec"], pair=pair,
                                             draft=e.get("draft_spec")))
                    if e.get("measure") and pair == e["pair"]:
                        out.append(self.measured_cell(m, b, pair=e["pair"]))
        return out

    def table3_pair(self, i: int, entry: dict) -> str | None:
        """The pair whose traces Table 3 entry `i` replays: its `pair`, or with a `fallback_pair` what the
        workflow's memory plan decides."""
        if "fallback_pair" not in entry:
            return entry.get("pair")
        if self._table3_pair is None:
            raise ValueError(f"table3.models[{i}] has a fallback_pair: this plan was made without a memory plan")
        return self._table3_pair(i, entry)

    def table4_records(self) -> list[str]:
        t = self.config["table4"]
        return ([self.sim_cell("moespac", t["benchmark"], gamma=g, batch=b)
                 for b in t["batch_sizes"] for g in t["gammas"]] + self.paper_regime_record())

    def sweep_records(self, name: str) -> list[str]:
        s = self.config["sweeps"][name]
        if name == "K":
            return [self.sim_cell(k_method(v, m), s["benchmark"]) for m in s["methods"] for v in s["values"]]
        return [self.sim_cell(m, s["benchmark"], **{SWEEP_SETTING[name]: v}) for m in s["methods"] for v in s["values"]]

    def study_records(self, name: str) -> list[str]:
        """The record files of one study (none when its config section is off)."""
        if name.startswith("sweep_"):
            sweep = name.removeprefix("sweep_")
            return self.sweep_records(sweep) if self.config["sweeps"][sweep]["activate"] else []
        if name != "table1" and not self.active(name):
            return []
        return getattr(self, f"{name}_records")()

    def traces_used(self) -> list[str]:
        """Every trace file the figures read directly."""
        figs = self.config["figures"]
        benchmarks = figs["fig4_benchmarks"] + [figs["heatmap_benchmark"]]
        return self.study_traces(benchmarks) + self.study_traces(benchmarks, draft=False)

    def _studies(self) -> dict[str, list[str]]:
        names = ["table1", "table2", "table3", "table4"] + [f"sweep_{s}" for s in self.config["sweeps"]]
        out = {n: self.study_records(n) for n in names}
        out = {n: files for n, files in out.items() if files or n == "table1"}
        cells = [c for records in out.values() for c in records]
        traces = {self.trace_of[c] for c in cells if c.startswith("results/simulated/")} | set(self.traces_used())
        # the engine runs that recorded them (a derived AR trace's record is no run: it is left out)
        out["traces"] = sorted(t.replace(".npz", ".json") for t in traces
                               if not self.derives_ar_trace(self.trace_key[t]))
        return out

    # ---- outputs

    def source_files(self, source: str) -> list[str]:
        """The files an output's input source names (moespac/analysis/outputs.py: study:, traces:, file:)."""
        kind, _, rest = source.partition(":")
        if kind == "study":
            return self.study_records(rest)
        if kind == "traces":
            key, mode = rest.rsplit(":", 1)
            return self.study_traces(as_list(lookup(self.config, key)), draft=mode == "sd")
        return [rest]

    def output_names(self, kind: str) -> list[str]:
        """The tables or figures this config builds."""
        return [n for n in output_names(kind) if OUTPUTS[n].active(self.config)]

    def final_paper_outputs(self) -> list[str]:
        c = self.config
        out = [f"paper_figs/{t}.{ext}" for t in self.output_names("table") for ext in ("csv", "md", "tex", "html")]
        out += [f"paper_figs/{f}.{ext}" for f in self.output_names("figure") for ext in ("png", "pdf")]
        if c["whatif"]["locality"]["activate"]:
            out += [f"paper_figs/whatif_locality.{ext}" for ext in ("csv", "md", "png", "pdf")]
        if self.paper_regime_record():
            out += [f"paper_figs/{page}.{ext}" for page in ("paper_regime", "consistency")
                    for ext in ("csv", "md", "png", "pdf")]
        out += [f"paper_figs/routing_stats.{ext}" for ext in ("csv", "md", "tex", "html")]
        return out + ["paper_figs/audit.md"]

    def whatif_traces(self) -> dict[str, str]:
        """The simulation pair's recorded SD and AR traces of the what-if's benchmark (Table 1's own)."""
        s, bench = self.sim, self.config["whatif"]["locality"]["benchmark"]
        return dict(sd=self.trace_file(s["pair"], bench, s["gamma"], s["batch_size"], s["max_new_tokens"]),
                    ar=self.trace_file(s["pair"], bench, 0, s["batch_size"], s["max_new_tokens"]))

    def output_sources(self) -> list[str]:
        """Every record and trace the paper outputs read. They are targets themselves: in a clean clone the
        committed outputs exist while their sources do not, and Snakemake does not rebuild a missing input of an
        output that exists (Table 6 was left stale that way when nothing else asked for results/smoke/numerics.json).
        """
        out = [c for records in self.studies.values() for c in records]
        out += ["results/overhead/scheduler.json", "results/smoke/numerics.json"]
        out += self.traces_used()
        if self.config["whatif"]["locality"]["activate"]:
            out += list(self.whatif_traces().values())
        return sorted(set(out + self.paper_regime_record()))

    def final_outputs(self) -> list[str]:
        """`rule all`'s inputs: the paper outputs, their sources, and the other pages, checks and the MLflow ingest."""
        c = self.config
        out = self.final_paper_outputs() + self.output_sources()
        if c["proxy_stats"]["activate"]:
            out += [f"paper_figs/proxy_stats_{pair}.md" for pair in c["proxy_stats"]["pairs"]]
        if c["smoke"]["activate"]:
            out += [f"results/smoke/{what}/{arch}.{ext}" for what, ext in (("lossless", "txt"), ("generate", "json"))
                    for arch in c["smoke"]["archs"]]
        if c["tracking"]["activate"]:
            out.append("results/mlflow/ingest.json")
        return out

    def profile_traces(self, method: str, benchmark: str, pair: str, gamma: int) -> list[str]:
        """The profiling run of a method that reads one (static placements, MoE-Infinity): the traces of the other
        benchmarks' prompts at the simulation's settings, never the replayed ones; none for other methods."""
        if not make_policy(get_method(method).policy).uses_profile():
            return []
        g = self.sim["gamma"] if int(gamma) > 0 else 0
        return [self.trace_file(pair, b, g, 1, self.sim["max_new_tokens"])
                for b in self.config["benchmarks"] if b != benchmark]

    def trace_limit(self, benchmark: str, batch) -> int | None:
        """Prompts for `simulation.limit` requests (a prompt of T turns is T requests); a trace of batch b needs at
        least b prompts per call."""
        if self.sim["limit"] is None:
            return None
        return max(-(-self.sim["limit"] // get_benchmark(benchmark).turns), int(batch))


WRAPPED_SYSTEMS = {"accelerate": "accelerate", "vllm": "vllm", "moespac-release": "moespac_release"}
"""The wrapped systems besides llama.cpp: `moespac wrapped` command name -> config section (one Table 1 row each)."""


def as_list(files) -> list:
    return [files] if isinstance(files, str) else list(files)
