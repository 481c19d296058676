# Models and external systems the study runs on: proxy pairs trained here, random micro pairs, hub pairs
# linked from the Hugging Face cache, and llama.cpp built from source.


rule build_proxy_pair:
    output:
        target="results/models/{pair}/target/config.json",
        draft="results/models/{pair}/draft/config.json",
    log:
        "results/logs/build_proxy_pair/{pair}.log",
    benchmark:
        "results/benchmarks/build_proxy_pair/{pair}.tsv"
    wildcard_constraints:
        pair=alternatives(pairs_of("build")),
    priority: 10
    conda:
        "../envs/moespac.yaml"
    # one thread each, so two pairs train side by side; the thread count that decides the weights is the
    # proxy config's (1), never the scheduler's
    threads: 1
    params:
        out=get_pair_folder,
        build=get_build_args,
    shell:
        "moespac build-proxy {params.build} --out {params.out:q} --force"
        " > {log} 2>&1"


rule make_micro_pair:
    output:
        target="results/models/{pair}/target/config.json",
        draft="results/models/{pair}/draft/config.json",
    log:
        "results/logs/make_micro_pair/{pair}.log",
    wildcard_constraints:
        pair=alternatives(pairs_of("micro")),
    conda:
        "../envs/moespac.yaml"
    params:
        out=get_pair_folder,
        arch=get_micro_arch,
    shell:
        "moespac make-micro --out {params.out:q} --arch {params.arch:q} > {log} 2>&1"


rule link_hub_pair:
    output:
        "resources/models/{pair}/linked.txt",
    log:
        "results/logs/link_hub_pair/{pair}.log",
    wildcard_constraints:
        pair=alternatives(pairs_of("target")),
    conda:
        "../envs/moespac.yaml"
    params:
        out=get_pair_folder,
        target=get_hub_target,
        draft=get_hub_draft,
    shell:
        # the hub cache holds the weights once; the pair folder links to its snapshots (for wrapped systems)
        # (a Table 3 pair may name no draft: its autoregressive traces need the target only)
        "(t=$(hf download {params.target:q} --quiet) && ln -sfn \"$t\" {params.out:q}/target"
        " && {{ [ -z {params.draft:q} ] || {{ d=$(hf download {params.draft:q} --quiet)"
        " && ln -sfn \"$d\" {params.out:q}/draft; }}; }}"
        " && echo {params.target:q} {params.draft:q} > {output}) > {log} 2>&1"


rule build_llamacpp:
    output:
        "results/build/llamacpp.json",
    log:
        "results/logs/build_llamacpp/build.log",
    benchmark:
        "results/benchmarks/build_llamacpp/build.tsv"
    # early where cores allow: fourteen llama.cpp runs wait for it. A priority only orders jobs that fit, so on
    # two cores this two-thread build still waits until no one-thread job is left (minute 49 of the idle clean
    # run in docs/pipeline.md); there every core is busy until then, so the order does not lengthen the run
    priority: 10
    conda:
        "../envs/moespac.yaml"
    threads: 2
    shell:
        "moespac wrapped build-llamacpp --jobs {threads} --json {output} > {log} 2>&1"


rule proxy_stats:
    # How close a pair behaves to the paper's models: alpha per benchmark, expert popularity, activation trend.
    input:
        pair=get_pair_ready,
    output:
        md=report(
            "paper_figs/proxy_stats_{pair}.md",
            caption="../report/proxy_stats.rst",
            category="Proxy pairs",
        ),
        record="results/proxy_stats/{pair}.json",
    log:
        "results/logs/proxy_stats/{pair}.log",
    conda:
        "../envs/moespac.yaml"
    threads: 1
    params:
        pair=get_pair_folder,
        run=get_proxy_stats_args,
    shell:
        "moespac proxy-stats --pair {params.pair:q} {params.run}"
        " --json {output.record} --markdown {output.md} > {log} 2>&1"
