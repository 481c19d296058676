"""MoE-SpeQ's self-draft, as a lookahead instrument: the target with INT4 experts routes the drafted tokens.

`SelfDraftExperts` lets the runtime run the target once more over the dense draft's tokens with its routed
experts quantised to INT4 (round-to-nearest, groups of 128 input columns); the routing of that pass is what
MoE-SpeQ's self-draft would have seen (moespac.engine.hybrid, `HybridRuntime.lookahead`).

Details: docs/internals.md#moespacengineselfdraftpy.
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
