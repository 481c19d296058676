"""PyTorch operators and host-device synchronisations per MoE layer: the hybrid layer against transformers'
own grouped experts path, side by side in one run. Goal: ops <= 2x stock, syncs <= 2.

    python benchmarks/layer_ops.py [--experts 128] [--top-k 8] [--tokens 9]

Operators are counted at the ATen dispatcher (every kernel a GPU would launch, and a CPU would run) inside the
experts call of one MoE layer, on a verify batch of --tokens tokens; the hybrid layer is measured with every
expert on the device (cache ratio 1), with every expert on the host (0), and with a quarter on the device.
Synchronisations are the engine's own count (moespac.engine.device: routing reads and host waits), which on
a GPU are exactly the points where the host waits for the device. Two counts per ratio: the path a GPU runs
(one grouped matmul per projection and side), and this CPU's (a sparse side runs one expert at a time, since
torch's CPU grouped matmul walks every empty group: fewer microseconds, more operators).
"""

from __future__ import annotations

import argparse
import copy

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def one_layer_model(experts: int, top_k: int, hidden: int):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=hidden // 4, num_experts=experts, num_experts_per_tok=top_k,
                         moe_intermediate_size=hidden // 2, intermediate_size=hidden)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


def count(experts_module, x, ids, w) -> int:
    with torch.no_grad(), CountOps() as c:
        experts_module(x, ids, w)
    return c.ops


def main() -> None:
    from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
    from moespac.models.experts import find_experts
    from moespac.registry import make_policy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=9, help="verify batch: gamma + 1")
    ap.add_argument("--hidden", type=int, default=256, help="model width (operator counts do not depend on it)")
    args = ap.parse_args()
    model = one_layer_model(args.experts, args.top_k, args.hidden)
    stock = copy.deepcopy(model)
    torch.manual_seed(1)
    x = torch.randn(args.tokens, args.hidden)
    ids = torch.stack([torch.randperm(args.experts)[:args.top_k] for _ in range(args.tokens)])
    w = torch.softmax(torch.randn(args.tokens, args.top_k), -1)
    stock_experts = find_experts(stock)[0][0]
    stock_ops = count(stock_experts, x, ids, w)
    distinct = len(torch.unique(ids))
    print(f"one MoE layer: {args.experts} experts, top-{args.top_k}, {args.tokens} tokens "
          f"({distinct} distinct experts), fp32, CPU")
    print(f"stock transformers ({stock.config._experts_implementation}) experts call: {stock_ops} ops (measured)")
    from moespac.engine import kernels

    rows = []
    for ratio, gpu_path in ((1.0, True), (0.25, True), (0.0, True), (0.25, False), (0.0, False)):
        kernels.CPU_SPARSE_LOOP = not gpu_path
        rt = HybridRuntime(model, make_policy("lru" if ratio else "all-host"),
                           RuntimeConfig(cache_ratio=ratio, copy_mode="sync"))
        try:
            rt.start_request(gamma=args.tokens - 1)
            layer = find_experts(model)[0][0]
            count(layer, x, ids, w)  # first visit: on-demand loads fill the cache
            syncs = rt.device.syncs
            ops = count(layer, x, ids, w)
            syncs = rt.device.syncs - syncs
        finally:
            rt.close()
        rows.append((ratio, ops, syncs, gpu_path))
        path = "grouped, the GPU's path" if gpu_path else "this CPU's path"
        print(f"hybrid layer, cache ratio {ratio:g} ({path}): {ops} ops ({ops / stock_ops:.2f}x stock), {syncs} "
              f"host-device syncs (measured)")
    kernels.CPU_SPARSE_LOOP = True
    worst = max(r[1] for r in rows if r[3]) / stock_ops
    syncs = max(r[2] for r in rows)
    print(f"goal ops <= 2x stock on the grouped path: {'OK' if worst <= 2 else 'MISSED'} (worst {worst:.2f}x); "
          f"goal syncs <= 2: {'OK' if syncs <= 2 else 'MISSED'} (worst {syncs})")


if __name__ == "__main__":
    main()
