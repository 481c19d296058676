# The paper's tables from result records: paper_figs/NAME.{csv,md,tex,html}, ours beside the paper's numbers,
# the timing label on every cell; and the audit page of the paper's headline claims. They take seconds, so on
# a cluster they run where Snakemake runs.


localrules:
    paper_table,
    routing_stats,
    audit,


rule paper_table:
    # every table of moespac/analysis/outputs.py: its records (Table 6: the numerics check's file)
    input:
        unpack(get_output_inputs),
    output:
        csv=report(
            "paper_figs/{table}.csv",
            caption="../report/table_data.rst",
            category="Data (long-form CSV)",
        ),
        md="paper_figs/{table}.md",
        tex="paper_figs/{table}.tex",
        html=report(
            "paper_figs/{table}.html", caption="../report/tables.rst", category="Tables"
        ),
    log:
        "results/logs/paper_table/{table}.log",
    conda:
        "../envs/moespac.yaml"
    params:
        prefix=output_prefix,
    shell:
        "moespac report table {wildcards.table} {input.records} --out {params.prefix} > {log} 2>&1"


rule routing_stats:
    # where each workload's routing sits beside the paper's (the simulated pair's traces, the what-if skews)
    input:
        unpack(get_routing_stats_traces),
    output:
        csv="paper_figs/routing_stats.csv",
        md="paper_figs/routing_stats.md",
        tex="paper_figs/routing_stats.tex",
        html=report(
            "paper_figs/routing_stats.html",
            caption="../report/routing_stats.rst",
            category="Tables",
        ),
    log:
        "results/logs/routing_stats/routing_stats.log",
    conda:
        "../envs/moespac.yaml"
    params:
        args=get_routing_stats_args,
        prefix=output_prefix,
    shell:
        "moespac report routing-stats {params.args} --out {params.prefix} > {log} 2>&1"


rule audit:
    input:
        unpack(get_audit_tables),
    output:
        report("paper_figs/audit.md", caption="../report/audit.rst", category="Audit"),
    log:
        "results/logs/audit/audit.log",
    params:
        tables=get_audit_args,
    conda:
        "../envs/moespac.yaml"
    shell:
        "moespac report audit {params.tables} --out {output} > {log} 2>&1"
