"""Every paper table and figure, declared once: its name, kind, title, builder and the inputs it reads.

The Snakemake rules (their inputs, which outputs a config builds, the wildcard constraints) and the choices of
`moespac report table|figure` all come from `OUTPUTS`, so a new table is one declaration here and one builder.
Light on purpose: the workflow and the CLI import it without pandas or matplotlib; builders load when called.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from moespac.errors import MoespacError

KINDS = ("table", "figure")


@dataclass(frozen=True)
class Output:
    """One paper output under paper_figs/: NAME.csv/.md/.tex/.html for a table, NAME.png/.pdf for a figure."""

    name: str
    """File stem under paper_figs/ and the name `moespac report table|figure` takes."""
    kind: str
    """'table' or 'figure'."""
    builder: str
    """'module:function' in moespac.analysis. A table's takes the rows of its records (or, when its input is a
    file:, that path) and returns (long-form frame, blocks); a figure's takes its input groups and a prefix."""
    inputs: dict[str, str]
    """Input group -> source: 'study:NAME' (the records of a study; none when it is off), 'traces:KEY:sd|ar' (the
    simulation pair's traces, with the draft or without, of the benchmark(s) config key KEY names) or 'file:PATH'.
    A table has one group, 'records'."""
    title: str = ""
    """A table's heading (its pages and the report)."""
    activate: tuple[str, ...] = ()
    """Config sections any of whose `activate` turns the output on; empty: always built."""
    settings: dict[str, str] = field(default_factory=dict)
    """Figure group -> config key whose value the builder gets as that group (e.g. the heatmap's layer)."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise MoespacError(f"output {self.name!r}: kind {self.kind!r}, one of {', '.join(KINDS)}")
        if self.kind == "table" and (set(self.inputs) != {"records"} or not self.title):
            raise MoespacError(f"output {self.name!r}: a table has one input group, 'records', and a title")
        for source in self.inputs.values():
            if source.partition(":")[0] not in ("study", "traces", "file"):
                raise MoespacError(f"output {self.name!r}: input {source!r} is not study:, traces: or file:")

    @property
    def reads_file(self) -> bool:
        """A table built from one named file (Table 6's numerics check), not from result records."""
        return self.inputs.get("records", "").startswith("file:")

    def load(self):
        """The builder function."""
        module, _, function = self.builder.partition(":")
        return getattr(importlib.import_module(f"moespac.analysis.{module}"), function)

    def active(self, config: dict) -> bool:
        """Whether a workflow config builds this output."""
        return not self.activate or any(lookup(config, key)["activate"] for key in self.activate)


def lookup(config: dict, key: str):
    """config['a']['b'] for key 'a.b'."""
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def _table(name, builder, title, records, activate=()):
    return Output(name, "table", builder, {"records": records}, title, activate)


OUTPUTS: dict[str, Output] = {o.name: o for o in [
    _table("table1", "tables:table1", "Table 1: TPS and latency of every method on the seven benchmarks",
           "study:table1"),
    _table("table2", "tables:table2", "Table 2: ablations of MoE-SpAc", "study:table2", ("table2",)),
    _table("table3", "tables:table3", "Table 3: other models and hardware", "study:table3", ("table3",)),
    _table("table4", "tables:table4", "Table 4: MoE-SpAc TPS over batch size and draft length", "study:table4",
           ("table4",)),
    _table("table6", "tables:table6", "Table 6: numerical validation of the hybrid MoE layer",
           "file:results/smoke/numerics.json"),
    _table("appendix_a1", "tables:appendix_a1", "Appendix A.1: acceptance, token yield, expert cost ratio and TPS",
           "study:table1"),
    Output("fig4_hot_cold", "figure", "figures:fig4_hot_cold",
           {"sd": "traces:figures.fig4_benchmarks:sd", "ar": "traces:figures.fig4_benchmarks:ar"}),
    Output("fig5_sensitivity", "figure", "figures:fig5_sensitivity",
           {"cache": "study:sweep_cache_ratio", "length": "study:sweep_gen_length", "K": "study:sweep_K"},
           activate=("sweeps.cache_ratio", "sweeps.gen_length", "sweeps.K")),
    Output("fig6_batch", "figure", "figures:fig6_batch", {"batch": "study:sweep_batch", "regime": "study:table4"},
           activate=("sweeps.batch",)),
    Output("fig7_draft_vs_cache", "figure", "figures:fig7_draft_vs_cache", {"records": "study:sweep_draft_cache"},
           activate=("sweeps.draft_cache",)),
    Output("fig8_expert_reuse", "figure", "figures:fig8_expert_reuse", {"records": "study:table4"},
           activate=("table4",)),
    Output("fig9_heatmaps", "figure", "figures:fig9_heatmaps",
           {"sd": "traces:figures.heatmap_benchmark:sd", "ar": "traces:figures.heatmap_benchmark:ar"},
           settings={"layer": "figures.heatmap_layer"}),
    Output("fig10_utility", "figure", "figures:fig10_utility", {"sd": "traces:figures.heatmap_benchmark:sd"}),
    Output("fig_overhead", "figure", "figures:fig_overhead", {"record": "file:results/overhead/scheduler.json"}),
]}


def names(kind: str) -> list[str]:
    return [name for name, o in OUTPUTS.items() if o.kind == kind]


def get_output(name: str, kind: str | None = None) -> Output:
    o = OUTPUTS.get(name)
    if o is None or (kind and o.kind != kind):
        known = names(kind) if kind else list(OUTPUTS)
        raise MoespacError(f"unknown {kind or 'output'} {name!r}; known: {', '.join(known)}")
    return o
