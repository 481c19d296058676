"""The engine's decode speed against the systems it should keep up with, side by side in one run, on a CPU:

1. autoregressive decoding, engine / stock transformers `generate()` (goal >= 0.8): greedy, the same prompts,
   every expert resident (cache ratio 1);
2. speculative decoding, engine / llama.cpp's speculative decoder (goal >= 0.6): the same pair (GGUF, f32),
   prompts, threads, draft length, sampling temperature and fixed output length, run as the pipeline runs
   them (`moespac bench` and `moespac wrapped llamacpp`).

    python benchmarks/engine_vs_reference.py --pair results/models/proxy [--prompts 4] [--tokens 64]

Decode tokens/s are each system's own: tokens after the first / decode time (the engine's clock, HF's
generate() timed around the call minus its prefill, llama.cpp's 'decoded' line). All measured.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def hf_decode_tps(model, prompt: list[int], tokens: int) -> float:
    """transformers generate() greedy: (tokens - 1) / (time of `tokens` new tokens - time of the first one)."""
    import torch

    ids = torch.tensor([prompt])
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=model.config.vocab_size)

    def gen(n):
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, **kw)
        return time.perf_counter() - t0

    first, full = min(gen(1) for _ in range(3)), gen(tokens)
    return (tokens - 1) / max(full - first, 1e-9)


def autoregressive(pair: Path, prompts: int, tokens: int) -> None:
    from moespac.datasets import encode_prompts, load_benchmark, seeded_sample
    from moespac.engine.session import EngineConfig, EngineSession
    from moespac.engine.speculative import Sampling
    from moespac.models.loading import load_pair

    target, _, tok = load_pair(str(pair / "target"), None, "fp32")
    stock = copy.deepcopy(target)
    items = encode_prompts(seeded_sample(load_benchmark("mt-bench"), prompts, 0), tok, max_context=1024,
                           max_new_tokens=tokens).items
    session = EngineSession(target, None, tok, EngineConfig(target=str(pair / "target"), policy="lru",
                                                            cache_ratio=1.0, copy_mode="sync"))
    hf, ours = [], []
    try:
        session.generate([items[0][1]], gamma=0, max_new_tokens=8, sampling=Sampling(), ignore_eos=True)  # warm
        for _, ids in items:
            hf.append(hf_decode_tps(stock, ids, tokens))
            (res,), _ = session.generate([ids], gamma=0, max_new_tokens=tokens, sampling=Sampling(), ignore_eos=True)
            ours.append(res.tokens_per_second)
    finally:
        session.close()
    e, h = statistics.median(ours), statistics.median(hf)
    print(f"autoregressive, greedy, {len(items)} MT-bench prompts x {tokens} tokens: engine {e:.1f} tok/s, "
          f"transformers generate() {h:.1f} tok/s (medians, measured); engine / HF = {e / h:.3f} "
          f"(goal >= 0.8: {'OK' if e / h >= 0.8 else 'MISSED'})")


def speculative(pair: Path, prompts: int, tokens: int, gamma: int, threads: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    common = ["--model-pair", str(pair), "--benchmark", "mt-bench", "--limit", str(prompts), "--seed", "0",
              "--max-new-tokens", str(tokens), "--temperature", "0.8", "--ignore-eos"]
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = Path(tmp) / "engine.json", Path(tmp) / "llamacpp.json"
        for cmd in (["bench", *common, "--policy", "lru", "--cache-ratio", "1", "--gamma", str(gamma), "--warmup", "1",
                     "--turns", "first", "--no-progress", "--out", str(ours)],
                    ["wrapped", "llamacpp", *common, "--draft", "--draft-max", str(gamma), "--threads", str(threads),
                     "--out", str(theirs)]):
            r = subprocess.run([sys.executable, "-m", "moespac", *cmd], env=env, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"{' '.join(cmd[:2])} failed:\n{r.stderr[-2000:]}")
        e = json.loads(ours.read_text())["metrics"]["tokens_per_s"]["mean"]
        w = json.loads(theirs.read_text())["metrics"]
        ll = w["decode_tokens_per_s"]
    print(f"speculative, gamma {gamma}, temperature 0.8, {prompts} MT-bench first turns x {tokens} tokens, {threads} "
          f"threads: engine {e:.1f} tok/s (measured), llama.cpp {ll:.1f} tok/s (wrapped); engine / llama.cpp = "
          f"{e / ll:.3f} (goal >= 0.6: {'OK' if e / ll >= 0.6 else 'MISSED'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", required=True, type=Path, help="a proxy pair folder (target/, draft/)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", default="", help="'ar' or 'sd' to leave one comparison out")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.skip != "ar":
        autoregressive(args.pair, args.prompts, args.tokens)
    if args.skip != "sd":
        speculative(args.pair, args.prompts, args.tokens, args.gamma, args.threads)


if __name__ == "__main__":
    main()
