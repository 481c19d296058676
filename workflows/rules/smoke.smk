rule make_micro:
    output:
        config="results/models/micro-{arch}/target/config.json",
    params:
        out=lambda wc, output: str(Path(output.config).parent.parent),
    log:
        "results/logs/make_micro/{arch}.log",
    conda:
        "../envs/moespac.yaml"
    shell:
        "moespac make-micro --out {params.out} --arch {wildcards.arch} > {log} 2>&1"


rule check_lossless:
    input:
        rules.make_micro.output.config,
    output:
        "results/smoke/lossless/{arch}.txt",
    params:
        models=lambda wc, input: str(Path(input[0]).parent.parent),
        prompts=config["smoke"]["lossless_prompts"],
        gammas=",".join(map(str, config["smoke"]["gammas"])),
        ratios=",".join(map(str, config["smoke"]["cache_ratios"])),
    log:
        "results/logs/check_lossless/{arch}.log",
    conda:
        "../envs/moespac.yaml"
    shell:
        "moespac check-lossless --target {params.models}/target --draft {params.models}/draft"
        " --prompts {params.prompts} --gammas {params.gammas} --cache-ratios {params.ratios}"
        " > {output}.tmp 2> {log} && mv {output}.tmp {output}"


rule generate_traced:
    input:
        rules.make_micro.output.config,
    output:
        record="results/smoke/generate/{arch}.json",
        trace="results/smoke/generate/{arch}.npz",
    params:
        models=lambda wc, input: str(Path(input[0]).parent.parent),
        policy=config["smoke"]["policy"],
        tokens=config["smoke"]["max_new_tokens"],
    log:
        "results/logs/generate_traced/{arch}.log",
    conda:
        "../envs/moespac.yaml"
    shell:
        "moespac generate --target {params.models}/target --draft {params.models}/draft --greedy"
        " --policy {params.policy} --max-new-tokens {params.tokens} --prompt 'Explain speculative decoding.'"
        " --json {output.record} --trace {output.trace} > {log} 2>&1"


rule numerics:
    output:
        "results/smoke/numerics.json",
    log:
        "results/logs/numerics/numerics.log",
    conda:
        "../envs/moespac.yaml"
    shell:
        "moespac numerics --json {output} > {log} 2>&1"
