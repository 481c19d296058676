"""The expert FFN kernel, shared by the hybrid layer, `numerics` and `calibrate`."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def expert_ffn(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act_fn) -> torch.Tensor:
    """One routed expert on its tokens: down(act(gate(x)) * up(x)).

    x [n, H]; gate_up [2I, H] (gate rows first, transformers' concatenated layout); down [H, I].
    """
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(act_fn(gate) * up, down)


def group_by_expert(flat_ids: torch.Tensor, num_experts: int):
    """Sort (token, slot) rows by expert: returns (order, counts) with rows of expert e at
    order[offsets[e]:offsets[e+1]]; stable so each expert's rows keep token order."""
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=num_experts)
    return order, counts
