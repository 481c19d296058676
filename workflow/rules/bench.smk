# The runs. Each writes one self-describing result record (moespac/bench/result.schema.json) atomically; on
# error the harness leaves RESULT.failure.json beside it. Timed rules hold the `gpu` resource (capped at 1 in
# the default profile) so that two timed jobs never share the accelerator (or, on a CPU, the cores).


ruleorder: derive_ar_trace > record_trace


rule record_trace:
    # One engine run records the activation trace every policy is then replayed on (routing does not depend
    # on the policy). gamma 0: autoregressive. Its record is a measured all-host run on this machine. One
    # thread, fixed (not {threads}, which --cores may change): the thread count is part of what decides the
    # trace's floats, and so its sampled tokens.
    input:
        pair=get_pair_ready,
    output:
        trace=cell_pattern("trace", ext=".npz"),
        record=cell_pattern("trace"),
    log:
        cell_pattern("trace", "results/logs/record_trace", ".log"),
    benchmark:
        cell_pattern("trace", "results/benchmarks/record_trace", ".tsv")
    wildcard_constraints:
        pair=alternatives(RECORDED_PAIRS),
    conda:
        "../envs/moespac.yaml"
    threads: 1
    params:
        models=get_model_args,
        limit=get_trace_limit,
        prompts=get_prompt_args,
        signals=get_recorded_signals,
    shell:
        "OMP_NUM_THREADS=1 moespac bench {params.models} --benchmark {wildcards.benchmark:q} --policy all-host"
        " --cache-ratio 0 --gamma {wildcards.gamma} --batch-size {wildcards.batch} --max-new-tokens {wildcards.tokens}"
        " {params.limit} {params.prompts} --warmup 0 --no-progress {params.signals}"
        " --trace {output.trace:q} --out {output.record:q} > {log} 2>&1"


rule derive_ar_trace:
    # A batch-1 AR trace is by default the AR view of the speculative trace (`simulation.ar_traces`): the kept
    # tokens' routing rows, one AR step each. No engine run.
    input:
        source=get_speculative_trace,
    output:
        trace=cell_pattern("trace", ext=".npz"),
        record=cell_pattern("trace"),
    log:
        cell_pattern("trace", "results/logs/derive_ar_trace", ".log"),
    wildcard_constraints:
        pair=alternatives(DERIVED_AR_PAIRS),
        gamma="0",
        batch="1",
    conda:
        "../envs/moespac.yaml"
    shell:
        "moespac derive-ar-trace {input.source:q} --out {output.trace:q} --json {output.record:q} > {log} 2>&1"


rule import_trace:
    # An imported pair's trace comes from its file (`moespac import-trace`: a serving stack's routing, steps of
    # gamma + 1 tokens).
    input:
        source=get_imported_file,
    output:
        trace=cell_pattern("trace", ext=".npz"),
        record=cell_pattern("trace"),
    log:
        cell_pattern("trace", "results/logs/import_trace", ".log"),
    wildcard_constraints:
        pair=alternatives(IMPORTED_PAIRS),
    conda:
        "../envs/moespac.yaml"
    params:
        args=get_import_args,
    shell:
        "moespac import-trace {input.source:q} {params.args} --benchmark {wildcards.benchmark:q}"
        " --gamma {wildcards.gamma} --max-new-tokens {wildcards.tokens} --out {output.trace:q}"
        " --json {output.record:q} > {log} 2>&1"


rule simulate_cell:
    # A trace replayed through one policy on a hardware profile with a model's expert sizes and the draft
    # spec's cost (seconds). {draft} is 'none' for autoregressive methods: no draft is charged.
    input:
        trace=get_trace,
        profile=get_profile_traces,
    output:
        cell_pattern("simulated"),
    log:
        cell_pattern("simulated", "results/logs/simulate_cell", ".log"),
    benchmark:
        cell_pattern("simulated", "results/benchmarks/simulate_cell", ".tsv")
    conda:
        "../envs/moespac.yaml"
    threads: 1
    params:
        draft=get_draft_spec_arg,
        bounds=get_bounds_flag,
        profile=get_profile_args,
    shell:
        "moespac bench --timing simulated --from-trace {input.trace} {params.profile} --hardware {wildcards.hardware:q}"
        " --model-spec {wildcards.spec:q} {params.draft} --allow-topology-mismatch --benchmark {wildcards.benchmark:q}"
        " --method {wildcards.method:q} --cache-ratio {wildcards.cache} {params.bounds} --no-progress --out {output}"
        " > {log} 2>&1"


rule bench_measured:
    # The real engine timed on this machine.
    input:
        pair=get_pair_ready,
    output:
        cell_pattern("measured"),
    log:
        cell_pattern("measured", "results/logs/bench_measured", ".log"),
    benchmark:
        cell_pattern("measured", "results/benchmarks/bench_measured", ".tsv")
    conda:
        "../envs/moespac.yaml"
    threads: 2
    resources:
        gpu=1,
    params:
        models=get_model_args,
        limit=get_limit(ENGINE),
        prompts=get_prompt_args,
        warmup=ENGINE["warmup"],
    shell:
        "OMP_NUM_THREADS={threads} moespac bench {params.models} --benchmark {wildcards.benchmark:q}"
        " --method {wildcards.method:q} --gamma {wildcards.gamma} --batch-size {wildcards.batch}"
        " --max-new-tokens {wildcards.tokens} --cache-ratio {wildcards.cache} {params.limit} {params.prompts}"
        " --warmup {params.warmup} --no-progress --out {output} > {log} 2>&1"


rule bench_llamacpp:
    # llama.cpp as shipped (built from source), without or with the draft.
    input:
        pair=get_pair_ready,
        build="results/build/llamacpp.json",
    output:
        cell_pattern("llamacpp"),
    log:
        cell_pattern("llamacpp", "results/logs/bench_llamacpp", ".log"),
    benchmark:
        cell_pattern("llamacpp", "results/benchmarks/bench_llamacpp", ".tsv")
    wildcard_constraints:
        method="llamacpp|llamacpp-sd",
    conda:
        "../envs/moespac.yaml"
    threads: 2
    resources:
        gpu=1,
    params:
        pair=get_pair_folder,
        run=get_llamacpp_args,
    shell:
        "moespac wrapped llamacpp --model-pair {params.pair:q} --method {wildcards.method:q}"
        " --benchmark {wildcards.benchmark:q}"
        " --max-new-tokens {wildcards.tokens} {params.run} --threads {threads} --out {output} > {log} 2>&1"


rule bench_wrapped:
    # Accelerate (device_map="auto" offload), vLLM (--cpu-offload-gb) or the authors' MoE-SpAc release, run as
    # shipped. vLLM and the release need CUDA: elsewhere they write a record saying why they were skipped.
    input:
        pair=get_pair_ready,
    output:
        cell_pattern("wrapped"),
    log:
        cell_pattern("wrapped", "results/logs/bench_wrapped", ".log"),
    benchmark:
        cell_pattern("wrapped", "results/benchmarks/bench_wrapped", ".tsv")
    wildcard_constraints:
        system="accelerate|vllm|moespac-release",
    conda:
        "../envs/moespac.yaml"
    threads: 2
    resources:
        gpu=1,
    params:
        pair=get_pair_folder,
        run=get_wrapped_args,
    shell:
        "OMP_NUM_THREADS={threads} moespac wrapped {wildcards.system:q} --model-pair {params.pair:q}"
        " --method {wildcards.system:q}"
        " --benchmark {wildcards.benchmark:q} --max-new-tokens {wildcards.tokens} {params.run} --out {output}"
        " > {log} 2>&1"
