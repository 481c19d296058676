"""SpecExp ("Speculating Experts"): at layer l, predict layer l+1's top-k experts and stream them in while
layer l computes; there is no persistent expert cache.

Source: axonn-ai/yalis branch `offload_prefetch` (yalis/external/model.py, commit b1970f7881), Madan et
al., "Speculating Experts Accelerates Inference for Mixture-of-Experts", arXiv 2603.19289; MoE-SpAc
Table 1 row "SpecExp".
- Predictor: SpecExp forms a quasi hidden state from the post-attention residual plus offline "default
  vectors" of layer l's chosen experts and applies layer l+1's norm and router. Stand-in here: the
  recorded cross-layer router prediction (signal 'cross_layer_topk': layer l+1's router on layer l's
  input), which needs no offline vectors. After layer l, every predicted expert of l+1 is prefetched.
- Streaming: prefetched and loaded experts go through the cache with least-recently-used replacement, so
  the slots behave as a ring of the latest layers; with more slots than one step's traffic they retain
  experts across steps, which SpecExp's fixed per-layer buffers would not.
- Execution: SpecExp runs the *speculated* experts with their weights and does not re-route, so it is
  lossy. Default here is the lossless variant: the routed experts that were not predicted are loaded on
  demand. `lossy_execution=True` marks the policy lossy, loads nothing on demand and counts those
  experts in describe()['speculation_misses']; the real engine cannot run a speculated expert in place
  of a routed one, so they run on the host (outputs stay exact, timing differs from SpecExp's).
"""

from __future__ import annotations

import numpy as np

from baselines._common import PrefetchLRU, missing, next_layer_prediction
from moespac.policy import LayerPlan, Prefetch


class SpecExp(PrefetchLRU):
    name = "specexp"
    lossless = True
    needs_draft = False
    requires = ("cross_layer_topk",)
    source = "axonn-ai/yalis offload_prefetch, yalis/external/model.py (b1970f7881); arXiv 2603.19289; MoE-SpAc Table 1"
    stand_in = ("the recorded cross-layer router prediction replaces SpecExp's quasi hidden state from offline "
                "default vectors")

    def __init__(self, lossy_execution: bool = False):
        self.lossy_execution = bool(lossy_execution)
        """Do not load mispredicted experts (SpecExp runs the speculated ones instead); lossy."""
        self.lossless = not self.lossy_execution

    def reset(self, ctx):
        placement = super().reset(ctx)
        self.step = None
        self.speculation_misses = 0
        return placement

    def begin_step(self, step, cache):
        self.step = step
        return []

    def plan_layer(self, layer, counts, cache) -> LayerPlan:
        plan = super().plan_layer(layer, counts, cache)
        if not self.lossy_execution:
            return plan
        self.speculation_misses += len(missing(layer, counts, cache))
        return LayerPlan()

    def end_layer(self, layer, counts, cache) -> list[Prefetch]:
        if layer + 1 >= self.ctx.topology.num_layers:
            return []
        predicted = np.flatnonzero(next_layer_prediction(self.step, layer, self.ctx.topology.num_experts, self.name))
        self.touch((layer + 1, int(e)) for e in predicted)
        return [Prefetch(layer + 1, int(e)) for e in predicted if not cache.resident[layer + 1, e]]

    def describe(self) -> dict:
        return {"speculation_misses": self.speculation_misses}
