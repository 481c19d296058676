"""vLLM with `cpu_offload_gb` (the `--cpu-offload-gb` flag) as users run it, one request at a time, greedy or
sampling (`SamplingParams(temperature=T, seed=..., ignore_eos=...)`).

CUDA only: where torch sees no CUDA GPU, or vLLM is not installed, the run writes a record with
`skipped: true` and the reason, and exits 0 so the pipeline goes on.
UNTESTED: the code path that runs vLLM has never executed.

Details: docs/baselines.md#vllm-wrapped.
"""

from __future__ import annotations

import time
from pathlib import Path

from baselines.programs._common import (add_common_arguments, benchmark_prompts, check_common_arguments,
                                        cuda_missing_reason, filed_under, skipped_record, wrapped_record)
from moespac.errors import MoespacError

SYSTEM = "vllm"


def add_arguments(p) -> None:
    add_common_arguments(p)
    g = p.add_argument_group("vllm")
    g.add_argument("--cpu-offload-gb", type=float, default=None,
                   help="GiB of weights kept in host memory (default: half the target's weights; the paper used 60)")
    g.add_argument("--draft", action="store_true", help="speculative decoding with DIR/draft")
    g.add_argument("--draft-max", type=int, default=8, help="num_speculative_tokens (default: %(default)s)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="vLLM's GPU memory share (default: %(default)s)")


def skip_reason() -> str | None:
    """Why vLLM cannot run here, or None."""
    reason = cuda_missing_reason()
    if reason:
        return f"vLLM's CPU offload needs CUDA: {reason}"
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        return f"vLLM is not installed ({e}); pip install vllm on a CUDA machine"
    return None


def config_of(args) -> dict:
    return dict(system=SYSTEM, model_pair=str(args.model_pair), benchmark=args.benchmark, limit=args.limit,
                seed=args.seed, max_new_tokens=args.max_new_tokens, max_context=args.max_context,
                temperature=args.temperature, ignore_eos=args.ignore_eos,
                cpu_offload_gb=args.cpu_offload_gb, speculative=bool(args.draft), draft_max=args.draft_max)


def sampling_options(args, max_tokens: int) -> dict:
    """SamplingParams keywords of one request: temperature 0 is vLLM's greedy; the per-request seed makes a
    sampled run repeatable; ignore_eos keeps generating to max_tokens."""
    return dict(max_tokens=max_tokens, temperature=args.temperature, seed=args.seed, ignore_eos=args.ignore_eos)


def _spec_counts(llm) -> tuple[int, int] | None:
    """(drafted, accepted) from vLLM's metrics, when this vLLM version exposes them."""
    try:
        metrics = {m.name: m for m in llm.get_metrics()}
        return (int(metrics["vllm:spec_decode_num_draft_tokens"].value),
                int(metrics["vllm:spec_decode_num_accepted_tokens"].value))
    except Exception:  # older/newer versions name or expose these differently
        return None


def run_benchmark(args) -> dict:
    check_common_arguments(args)
    reason = skip_reason()
    if reason:
        return skipped_record(SYSTEM, config_of(args), method=filed_under(args, "vllm"), reason=reason)
    from vllm import LLM, SamplingParams, TokensPrompt

    from moespac.models.loading import load_tokenizer

    pair = Path(args.model_pair)
    offload = args.cpu_offload_gb
    if offload is None:
        offload = sum(f.stat().st_size for f in (pair / "target").glob("*.safetensors")) / 2 / 2**30
    if offload < 0:
        raise MoespacError(f"--cpu-offload-gb {offload} must be >= 0")
    spec = dict(model=str(pair / "draft"), num_speculative_tokens=args.draft_max) if args.draft else None
    llm = LLM(model=str(pair / "target"), tokenizer=str(pair / "target"), cpu_offload_gb=offload, seed=args.seed,
              max_model_len=args.max_context, gpu_memory_utilization=args.gpu_memory_utilization,
              speculative_config=spec)
    tok = load_tokenizer(str(pair / "target"))
    prompts, skipped = benchmark_prompts(tok, args.benchmark, args.limit, args.seed, args.max_context,
                                         args.max_new_tokens)
    # warm-up
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0].ids)], SamplingParams(**sampling_options(args, 2)))
    requests = []
    for p in prompts:
        t0 = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=p.ids)], SamplingParams(**sampling_options(args, 1)),
                     use_tqdm=False)
        prefill = time.perf_counter() - t0
        before = _spec_counts(llm)
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=p.ids)],
                           SamplingParams(**sampling_options(args, args.max_new_tokens)), use_tqdm=False)
        latency = time.perf_counter() - t0
        n_new = len(out[0].outputs[0].token_ids)
        decode_s = max(latency - prefill, 1e-9)
        r = dict(id=p.id, prompt_tokens=len(p.ids), new_tokens=n_new, prefill_s=prefill, decode_s=decode_s,
                 latency_s=latency, decode_tokens_per_s=(n_new - 1) / decode_s if n_new > 1 else 0.0)
        after = _spec_counts(llm)
        if args.draft and before and after:
            r.update(drafted=after[0] - before[0], accepted=after[1] - before[1])
            r["acceptance_rate"] = r["accepted"] / r["drafted"] if r["drafted"] else None
        requests.append(r)
    config = dict(config_of(args), cpu_offload_gb=offload)
    return wrapped_record(SYSTEM, config, requests, method=filed_under(args, "vllm"), skipped_prompts=skipped,
                          untested_code_path=True)


def main(args) -> int:
    from baselines.programs._common import write_and_report

    return write_and_report("vllm", run_benchmark(args), args.out)
