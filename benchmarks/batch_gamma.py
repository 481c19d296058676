"""Batched decoding throughput over batch size x draft length, measured on CPU and simulated, next to Table 4.

    python benchmarks/batch_gamma.py --model-pair resources/proxy/default \
        [--batch-sizes 1,2,4,8,16,32] [--gammas 2,4,6,8,10] [--max-new-tokens 64] \
        [--hardware rtx4090-pcie4] [--sim-model-spec trace]

Per (B, gamma): B prompts of MT-bench decoded together with policy moespac on the real engine (measured: new
tokens / decode time on this CPU), then the recorded trace replayed on the hardware profile (simulated).
`--sim-model-spec qwen3-30b-a3b` scales the trace to that model's expert sizes when the topology matches
(e.g. the proxy built with `--config qwen3-30b-shape`). The paper's numbers are Qwen3-30B-A3B on an RTX 4090.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from moespac.datasets import load_benchmark
from moespac.commands.generate import encode_prompt
from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
from moespac.engine.speculative import generate_batch
from moespac.errors import MoespacError
from moespac.models.loading import load_pair
from moespac.models.specs import spec_from_config
from moespac.reference import read_reference
from moespac.registry import make_policy
from moespac.sim.simulate import SimConfig, simulate
from moespac.trace import TraceRecorder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-pair", default="resources/proxy/default")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    ap.add_argument("--gammas", default="2,4,6,8,10")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--cache-ratio", type=float, default=0.25)
    ap.add_argument("--hardware", default="rtx4090-pcie4")
    ap.add_argument("--sim-model-spec", default="trace")
    args = ap.parse_args()
    pair = Path(args.model_pair)
    target, draft, tok = load_pair(str(pair / "target"), str(pair / "draft"))
    spec = spec_from_config(target.config, name=str(pair))
    texts = [p.prompt for p in load_benchmark("mt-bench")]  # MT-bench prompts are tuples of turns: first turn used
    paper = {(int(r["batch_size"]), int(r["gamma"])): float(r["tps"]) for r in read_reference("table4_batch_gamma")}
    batches = [int(x) for x in args.batch_sizes.split(",")]
    gammas = [int(x) for x in args.gammas.split(",")]
    print(f"pair {pair} (a locally trained proxy, not Qwen3-30B-A3B); policy moespac; cache ratio {args.cache_ratio}; "
          f"{args.max_new_tokens} new tokens per sequence; simulated on {args.hardware} "
          f"with model spec {args.sim_model_spec}")
    print(f"{'B':>3s} {'gamma':>5s} {'measured tok/s (CPU)':>21s} {'simulated tok/s':>16s} {'paper tok/s':>12s}")
    with tempfile.TemporaryDirectory() as tmp:
        for b in batches:
            prompts = [encode_prompt(tok, t if isinstance(t, str) else t[0]) for t in texts[:b]]
            for g in gammas:
                rt = HybridRuntime(target, make_policy("moespac"), RuntimeConfig(cache_ratio=args.cache_ratio))
                rt.recorder = TraceRecorder(rt.topology, spec.to_dict(),
                                            meta=dict(gamma=g, batch_size=b, target=str(pair / "target"),
                                                      draft=str(pair / "draft")))
                try:
                    rt.start_request(gamma=g, batch_size=b, signals={"draft"})
                    res = generate_batch(target, prompts, draft=draft, gamma=g, max_new_tokens=args.max_new_tokens,
                                         runtime=rt, ignore_eos=True, max_batch=max(batches))
                finally:
                    rt.close()
                measured = sum(len(r.tokens) - 1 for r in res) / res[0].decode_s
                path = Path(tmp) / f"b{b}-g{g}.npz"
                rt.recorder.finish(trace_id=path.stem).save(path)
                try:
                    rec = simulate(SimConfig(trace=str(path), policy="moespac", hardware=args.hardware,
                                             model_spec=args.sim_model_spec, cache_ratio=args.cache_ratio,
                                             bounds=False))
                    sim = f"{rec['metrics']['tokens_per_s']:16.2f}"
                except MoespacError as e:
                    sim = f"{'n/a':>16s}"
                    print(f"  (simulation skipped: {e})")
                ref = paper.get((b, g))
                print(f"{b:3d} {g:5d} {measured:21.2f} {sim} {ref if ref is not None else 'n/a':>12}")
    print("measured = real engine on this CPU; simulated = the same traces replayed on the profile; paper = Table 4")


if __name__ == "__main__":
    main()
