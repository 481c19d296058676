# The engine's smoke study on random micro pairs: greedy speculative decoding equals greedy autoregressive
# decoding token for token over draft lengths and cache ratios, a traced generation, and the paper's Table 6
# numerics (hybrid MoE layer against the stock transformers layer).


rule make_micro:
    output:
        target="results/models/micro-{arch}/target/config.json",
        draft="results/models/micro-{arch}/draft/config.json",
    log:
        "results/logs/make_micro/{arch}.log",
    wildcard_constraints:
        arch=alternatives(MICRO_ARCHS),
    conda:
        "../envs/moespac.yaml"
    params:
        out="results/models/micro-{arch}",
    shell:
        "moespac make-micro --out {params.out:q} --arch {wildcards.arch:q} > {log} 2>&1"


rule check_lossless:
    input:
        target=rules.make_micro.output.target,
        draft=rules.make_micro.output.draft,
    output:
        "results/smoke/lossless/{arch}.txt",
    log:
        "results/logs/check_lossless/{arch}.log",
    conda:
        "../envs/moespac.yaml"
    params:
        models=models_of_input,
        prompts=config["smoke"]["lossless_prompts"],
        gammas=",".join(map(str, config["smoke"]["gammas"])),
        ratios=",".join(map(str, config["smoke"]["cache_ratios"])),
    shell:
        "moespac check-lossless --target {params.models:q}/target --draft {params.models:q}/draft"
        " --prompts {params.prompts} --gammas {params.gammas} --cache-ratios {params.ratios}"
        " > {output}.tmp 2> {log} && mv {output}.tmp {output}"


rule generate_traced:
    input:
        target=rules.make_micro.output.target,
        draft=rules.make_micro.output.draft,
    output:
        record="results/smoke/generate/{arch}.json",
        trace="results/smoke/generate/{arch}.npz",
    log:
        "results/logs/generate_traced/{arch}.log",
    conda:
        "../envs/moespac.yaml"
    params:
        models=models_of_input,
        policy=config["smoke"]["policy"],
        tokens=config["smoke"]["max_new_tokens"],
    shell:
        "moespac generate --target {params.models:q}/target --draft {params.models:q}/draft --greedy"
        " --policy {params.policy:q} --max-new-tokens {params.tokens} --prompt 'Explain speculative decoding.'"
        " --json {output.record} --trace {output.trace} > {log} 2>&1"


rule numerics:
    # Table 6; measured on this machine (fp32)
    output:
        "results/smoke/numerics.json",
    log:
        "results/logs/numerics/numerics.log",
    conda:
        "../envs/moespac.yaml"
    params:
        realistic="" if config["smoke"]["realistic_numerics"] else "--no-realistic",
    shell:
        "moespac numerics {params.realistic} --json {output} > {log} 2>&1"
