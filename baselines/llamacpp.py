"""llama.cpp with `--n-cpu-moe N`: the routed experts of the first N layers stay in host memory and are
computed by the CPU; every other layer's experts are resident. Static: no cache, no prefetch, no copies.

N defaults to L - capacity // E (whole layers); `cpu_moe=true` is `--cpu-moe` (N = L). MoE-SpAc Table 1 rows
"llama.cpp" and "llama.cpp w/ SD" (`llamacpp-sd`: the same placement, another decoding loop).

Provenance and upstream details: docs/baselines.md#llamacpp.
"""

from __future__ import annotations

from baselines._common import layer_mask
from moespac.errors import MoespacError
from moespac.policy import Policy, PolicyContext


class LlamaCpp(Policy):
    name = "llamacpp"
    lossless = True
    needs_draft = False
    requires = ()
    source = "ggml-org/llama.cpp --n-cpu-moe (PR #15077, b6089); MoE-SpAc Table 1"

    def __init__(self, n_cpu_moe: int | None = None, cpu_moe: bool = False):
        if n_cpu_moe is not None and n_cpu_moe < 0:
            raise MoespacError(f"policy {self.name!r}: n_cpu_moe must be >= 0, got {n_cpu_moe}")
        if cpu_moe and n_cpu_moe is not None:
            raise MoespacError(f"policy {self.name!r}: give cpu_moe (every layer) or n_cpu_moe, not both")
        self.n_cpu_moe = n_cpu_moe
        """Layers whose experts stay on the host (from layer 0); default: as few as the cache allows."""
        self.cpu_moe = bool(cpu_moe)
        """--cpu-moe / -ot exps=CPU: every layer's experts on the host."""

    def reset(self, ctx: PolicyContext):
        super().reset(ctx)
        L, E = ctx.topology.num_layers, ctx.topology.num_experts
        n = L if self.cpu_moe else max(L - ctx.capacity // E, 0) if self.n_cpu_moe is None else min(self.n_cpu_moe, L)
        if (L - n) * E > ctx.capacity:
            raise MoespacError(f"policy {self.name!r}: n_cpu_moe={n} leaves {L - n} layers x {E} experts on the "
                               f"device, more than the cache's {ctx.capacity} slots; use n_cpu_moe >= "
                               f"{L - ctx.capacity // E}")
        self.host_layers = n
        return layer_mask(L, E, range(n, L))

    def describe(self) -> dict:
        return {"n_cpu_moe": self.host_layers, "cpu_moe": self.cpu_moe}


class LlamaCppSD(LlamaCpp):
    name = "llamacpp-sd"
    needs_draft = True
    source = "ggml-org/llama.cpp --n-cpu-moe (PR #15077) + speculative decoding (-md, --draft-max); MoE-SpAc Table 1"
