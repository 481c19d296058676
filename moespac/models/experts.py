"""Where a transformers MoE model keeps its routed experts (the modules its experts interface decorates), and
their shape: what the engine patches and what a loader checks before calling a model an MoE."""

from __future__ import annotations

import torch

from moespac.errors import MoespacError


def is_experts_module(module) -> bool:
    """A routed-experts module of transformers' experts interface (its decorator sets these flags)."""
    return isinstance(module, torch.nn.Module) and hasattr(module, "has_gate") and hasattr(module, "has_bias") \
        and (hasattr(module, "gate_up_proj") or hasattr(module, "up_proj")) and hasattr(module, "down_proj")


def find_experts(model) -> list[tuple[torch.nn.Module, torch.nn.Module | None]]:
    """(experts module, its router) for every routed-MoE layer, in layer order."""
    out = []
    for name, module in model.named_modules():
        if is_experts_module(module):
            parent = model.get_submodule(name.rpartition(".")[0])
            router = next((getattr(parent, n) for n in ("gate", "router") if hasattr(parent, n)), None)
            out.append((module, router))
    return out


def experts_per_token(model, experts) -> int:
    c = experts.config if hasattr(experts, "config") else model.config
    c = c.get_text_config() if hasattr(c, "get_text_config") else c
    for name in ("num_experts_per_tok", "moe_topk", "top_k"):
        if getattr(c, name, None):
            return int(getattr(c, name))
    raise MoespacError(f"{type(model).__name__}: no experts-per-token in its config")
