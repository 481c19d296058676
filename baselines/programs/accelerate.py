"""HF Accelerate big-model offload as users run it: transformers `from_pretrained(device_map="auto",
max_memory=...)`, then plain `generate` (greedy, or `do_sample=True, temperature=T` after `set_seed`;
`min_new_tokens=max_new_tokens` for --ignore-eos), timed per request (prefill = time to the first new token).

Accelerate places whole decoder layers in module order on the GPU up to the GPU budget and the rest on
the CPU, copying an offloaded layer's weights in for each use. With no GPU the only device is the CPU:
every module is placed there and nothing is offloaded; the record says so rather than calling it an
offload run. The GPU budget defaults to half the target's weights so that a GPU run does offload.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from baselines.programs._common import (add_common_arguments, benchmark_prompts, check_common_arguments, filed_under,
                                        wrapped_record)
from moespac.errors import MoespacError

SYSTEM = "accelerate"


def add_arguments(p) -> None:
    add_common_arguments(p)
    g = p.add_argument_group("accelerate")
    g.add_argument("--max-gpu-gib", type=float, default=None,
                   help="GPU budget for weights in GiB (default: half the target's weights; ignored without a GPU)")
    g.add_argument("--max-cpu-gib", type=float, default=None, help="CPU budget in GiB (default: no limit)")
    g.add_argument("--dtype", default="auto", help="auto, fp32, bf16 or fp16 (default: %(default)s)")


def max_memory(weight_bytes: int, gpu: bool, max_gpu_gib: float | None, max_cpu_gib: float | None) -> dict:
    """The `max_memory` map handed to from_pretrained (GiB strings, as Accelerate takes them)."""
    mem = {}
    if gpu:
        gib = max_gpu_gib if max_gpu_gib is not None else weight_bytes / 2 / 2**30
        if gib <= 0:
            raise MoespacError(f"--max-gpu-gib {gib} must be > 0")
        mem[0] = f"{gib:.6f}GiB"
    if max_cpu_gib is not None:
        if max_cpu_gib <= 0:
            raise MoespacError(f"--max-cpu-gib {max_cpu_gib} must be > 0")
        mem["cpu"] = f"{max_cpu_gib:.6f}GiB"
    return mem


def placement(device_map: dict) -> dict:
    """How many top-level entries of hf_device_map sit on each device, and whether anything left the GPU."""
    counts = Counter(str(v) for v in device_map.values())
    gpu = any(k not in ("cpu", "disk") for k in counts)
    return dict(modules_per_device=dict(counts), offloaded=gpu and bool(counts.get("cpu") or counts.get("disk")))


class _Clock:
    """A generate() streamer that timestamps the prompt and each new token (prefill = prompt -> first token)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def generate_options(args, tok) -> dict:
    """generate() keywords for the decoding settings: greedy at temperature 0, else sampling at T (top-k/top-p
    stay the model's generation_config defaults, as for any user); --ignore-eos masks EOS until the length cap."""
    gen = dict(do_sample=args.temperature > 0, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    if args.temperature > 0:
        gen["temperature"] = args.temperature
    if args.ignore_eos:
        gen["min_new_tokens"] = args.max_new_tokens
    return gen


def run_benchmark(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, set_seed

    from moespac.models.loading import DTYPES, load_tokenizer

    check_common_arguments(args)
    target = Path(args.model_pair) / "target"
    if args.dtype not in DTYPES:
        raise MoespacError(f"--dtype {args.dtype!r}: one of {', '.join(DTYPES)}")
    gpu = torch.cuda.is_available()
    weight_bytes = sum(f.stat().st_size for f in target.glob("*.safetensors"))
    mem = max_memory(weight_bytes, gpu, args.max_gpu_gib, args.max_cpu_gib)
    model = AutoModelForCausalLM.from_pretrained(str(target), device_map="auto", max_memory=mem or None,
                                                 dtype=DTYPES[args.dtype]).eval()
    tok = load_tokenizer(str(target))
    prompts, skipped = benchmark_prompts(tok, args.benchmark, args.limit, args.seed, args.max_context,
                                         args.max_new_tokens)
    first = next(model.parameters()).device if not gpu else torch.device("cuda", 0)
    gen = generate_options(args, tok)
    with torch.inference_mode():
        warm = dict(gen, min_new_tokens=2) if args.ignore_eos else gen
        model.generate(torch.tensor([prompts[0].ids], device=first), max_new_tokens=2, **warm)  # warm-up, untimed
        set_seed(args.seed)  # after the warm-up, so the samples do not depend on it
        requests = []
        for p in prompts:
            clock = _Clock()
            t0 = time.perf_counter()
            out = model.generate(torch.tensor([p.ids], device=first), max_new_tokens=args.max_new_tokens,
                                 streamer=clock, **gen)
            t_end = time.perf_counter()
            n_new = out.shape[1] - len(p.ids)
            t_first = clock.times[1] if len(clock.times) > 1 else t_end
            decode_s = t_end - t_first
            requests.append(dict(id=p.id, prompt_tokens=len(p.ids), new_tokens=n_new, prefill_s=t_first - t0,
                                 decode_s=decode_s, latency_s=t_end - t0,
                                 decode_tokens_per_s=(n_new - 1) / decode_s if n_new > 1 and decode_s > 0 else 0.0))
            print(f"{p.id}: {n_new} tokens, decode {requests[-1]['decode_tokens_per_s']:.2f} tok/s")
    where = placement(getattr(model, "hf_device_map", {}) or {"": str(first)})
    config = dict(system=SYSTEM, model_pair=str(args.model_pair), benchmark=args.benchmark, limit=args.limit,
                  seed=args.seed, max_new_tokens=args.max_new_tokens, max_context=args.max_context, dtype=args.dtype,
                  temperature=args.temperature, ignore_eos=args.ignore_eos,
                  max_memory={str(k): v for k, v in mem.items()}, gpu=gpu)
    note = ("GPU run: modules beyond the GPU budget sit on the CPU and are copied in for each use" if where["offloaded"]
            else "no offload: " + ("no GPU, every module is on the CPU (the host is the only device)" if not gpu
                                   else "the whole model fit the GPU budget"))
    sampling = dict(generate={k: v for k, v in gen.items() if k not in ("eos_token_id", "pad_token_id")})
    if args.temperature > 0:  # what else shapes the samples: the model's own generation_config
        sampling.update(top_k=model.generation_config.top_k, top_p=model.generation_config.top_p)
    return wrapped_record(SYSTEM, config, requests, method=filed_under(args, "accelerate"), placement=where,
                          offload_note=note, skipped_prompts=skipped, sampling=sampling,
                          definitions=dict(prefill_s="generate() start to the first new token (streamer clock)",
                                           decode_tokens_per_s="(new tokens - 1) / (end - first new token)"))


def main(args) -> int:
    from moespac.bench.record_files import write_result

    record = run_benchmark(args)
    write_result(args.out, record)
    m = record["metrics"]
    print(f"accelerate: {m['decode_tokens_per_s']:.2f} tok/s decode (wrapped, {m['requests']} prompts); "
          f"{record['offload_note']}")
    print(f"record: {args.out}")
    return 0
