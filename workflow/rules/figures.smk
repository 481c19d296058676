# The paper's figures (PNG + PDF, seaborn) from result records and activation traces, and the measurement
# behind the Section 3.4 overhead figure.


rule scheduler_overhead:
    # MoE-SpAc's estimator and balancer timed at Qwen3-30B-A3B's shape on this CPU (measured)
    output:
        "results/overhead/scheduler.json",
    log:
        "results/logs/scheduler_overhead/scheduler.log",
    conda:
        "../envs/moespac.yaml"
    threads: 1
    resources:
        gpu=1,
    params:
        alpha=config["figures"]["overhead_alpha"],
        repeats=config["figures"]["overhead_repeats"],
    shell:
        "OMP_NUM_THREADS={threads} moespac report overhead --alpha {params.alpha} --repeats {params.repeats} --json {output} > {log} 2>&1"


rule paper_figure:
    input:
        unpack(get_output_inputs),
    output:
        png=report(
            "paper_figs/{figure}.png",
            caption="../report/figures.rst",
            category="Figures",
        ),
        pdf="paper_figs/{figure}.pdf",
    log:
        "results/logs/paper_figure/{figure}.log",
    conda:
        "../envs/moespac.yaml"
    params:
        groups=get_figure_groups,
        prefix=output_prefix,
    shell:
        "moespac report figure {wildcards.figure} {params.groups} --out {params.prefix} > {log} 2>&1"


rule whatif_locality:
    # simulated: the methods' tokens/s against routing locality (synthetic traces + the recorded pair)
    input:
        unpack(get_whatif_traces),
    output:
        record="results/whatif/locality.json",
        csv="paper_figs/whatif_locality.csv",
        md="paper_figs/whatif_locality.md",
        png=report(
            "paper_figs/whatif_locality.png",
            caption="../report/whatif.rst",
            category="Figures",
        ),
        pdf="paper_figs/whatif_locality.pdf",
    log:
        "results/logs/whatif_locality/locality.log",
    conda:
        "../envs/moespac.yaml"
    params:
        options=get_whatif_options,
        prefix=output_prefix_of_md,
    shell:
        "moespac report whatif-locality {params.options} --recorded {input.sd} {input.ar} --allow-topology-mismatch "
        "--json {output.record} --out {params.prefix} > {log} 2>&1"


rule paper_regime:
    # simulated: every Table 1 method on synthetic routing fitted to the paper's App. A.1 statistics
    output:
        record="results/whatif/paper_regime.json",
        csv="paper_figs/paper_regime.csv",
        md="paper_figs/paper_regime.md",
        png=report(
            "paper_figs/paper_regime.png",
            caption="../report/paper_regime.rst",
            category="Figures",
        ),
        pdf="paper_figs/paper_regime.pdf",
        # the traces its cells replay (the routing-stats page reads the speculative ones)
        sd=PLAN.paper_regime_traces().values(),
        ar=PLAN.paper_regime_traces(draft=False).values(),
    log:
        "results/logs/paper_regime/paper_regime.log",
    benchmark:
        "results/benchmarks/paper_regime/paper_regime.tsv"
    conda:
        "../envs/moespac.yaml"
    # its ~700 replays are independent: spread over cores, so it never runs alone on one while the rest wait
    # (Snakemake scales 8 down to --cores; a fixed number, as `workflow.cores` is unset outside a run, e.g. --report)
    threads: 8
    params:
        options=get_paper_regime_options,
        prefix=output_prefix_of_md,
        traces=output_folder_of_traces,
    shell:
        "moespac report paper-regime {params.options} --json {output.record} --out {params.prefix}"
        " --traces {params.traces:q} --jobs {threads} > {log} 2>&1"


rule consistency:
    # simulated: the paper's host inferred from its own llama.cpp rows, every method predicted under it, the verdict
    input:
        record="results/whatif/paper_regime.json",
    output:
        csv="paper_figs/consistency.csv",
        md="paper_figs/consistency.md",
        png=report(
            "paper_figs/consistency.png",
            caption="../report/consistency.rst",
            category="Figures",
        ),
        pdf="paper_figs/consistency.pdf",
    log:
        "results/logs/consistency/consistency.log",
    conda:
        "../envs/moespac.yaml"
    params:
        prefix=output_prefix_of_md,
    shell:
        "moespac report consistency --record {input.record} --out {params.prefix} > {log} 2>&1"
