"""MoE-SpeQ's self-draft, as a lookahead instrument: the target with INT4 experts routes the drafted tokens.

MoE-SpeQ drafts with the target itself: its routed experts quantised to INT4 (GPTQ, group 128), router,
attention and shared experts in full precision, the KV cache shared with the target. While it drafts, its
routing says which experts the verification will need (the Expert Lookahead Buffer). Our pairs draft with a
dense model, whose tokens (and acceptance) we keep; `SelfDraftExperts` lets the runtime run the target once
more over those drafted tokens with INT4 experts, and the routing of that pass is what MoE-SpeQ's self-draft
would have seen for them (moespac.engine.hybrid, `HybridRuntime.lookahead`).

- Quantisation: symmetric round-to-nearest INT4 per group of 128 input columns of each weight matrix
  (GPTQ's group size; GPTQ's error-compensating rounding is not reproduced, so this routing strays from the
  full-precision one at least as often as GPTQ's would). Biases stay exact.
- A layer's experts are quantised together when the layer is first run, and kept packed on the host (about a
  quarter of their full-precision bytes, as MoE-SpeQ's INT4 draft experts are); a pass dequantises only the
  experts it routes to.
"""

from __future__ import annotations

import numpy as np
import torch

from moespac.engine.store import ExpertStore, int4_pack, int4_unpack

GROUP = 128  # input columns per INT4 scale (GPTQ's default group size, MoE-SpeQ's setting)


class SelfDraftExperts:
    """INT4 versions of a store's experts, dequantised on demand for a lookahead pass."""

    def __init__(self, store: ExpertStore, group: int = GROUP):
        self.store, self.group = store, group
        self.names = store.layout.names[:2]  # the two projections; biases (names[2:]) stay exact
        self.transposed = store.layout.is_transposed
        self._packed: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def _as_out_in(self, w: torch.Tensor) -> torch.Tensor:
        """[E, out, in] whatever the layout (groups run along input columns)."""
        return w.transpose(-2, -1) if self.transposed else w

    def weights(self, layer: int, experts: np.ndarray) -> dict[str, torch.Tensor]:
        """Stacks [len(experts), ...] of every expert tensor of `layer` in the store's dtype and layout, group g =
        experts[g]: the projections through INT4, the biases exact."""
        host = self.store.host[layer]
        idx = torch.as_tensor(np.asarray(experts, dtype=np.int64))
        out = {}
        for n in self.names:
            w = self._as_out_in(host[n])
            if (layer, n) not in self._packed:
                self._packed[layer, n] = int4_pack(w, self.group)
            codes, scale = self._packed[layer, n]
            out[n] = self._as_out_in(int4_unpack(codes[idx], scale[idx], w.shape).to(w.dtype))
        out.update({n: host[n][idx] for n in self.store.layout.names[2:]})
        return out
