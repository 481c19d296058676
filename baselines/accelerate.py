"""HF Accelerate big-model offload (`device_map="auto"`): whole layers resident in layer order, the rest
copied in for each use and dropped after it.

Modelled with baselines/_common.StreamedLayers: the first layers resident, a staging area for the copies, and
an offloaded layer copied whole (all E experts, routed or not). MoE-SpAc Table 1 row "Accelerate".

Provenance and upstream details: docs/baselines.md#hf-accelerate.
"""

from __future__ import annotations

import numpy as np

from baselines._common import StreamedLayers
from moespac.policy import LayerPlan


class Accelerate(StreamedLayers):
    name = "accelerate"
    lossless = True
    needs_draft = False
    requires = ()
    source = "huggingface/accelerate infer_auto_device_map + offload hooks (cdde654039); MoE-SpAc Table 1"
    keep_first_layers = True

    def plan_layer(self, layer, counts, cache) -> LayerPlan:
        plan = super().plan_layer(layer, counts, cache)
        if self.placed[layer].all():
            return plan
        idle = np.flatnonzero((counts == 0) & ~cache.resident[layer])  # the rest of the fused layer comes along
        return LayerPlan(load=plan.load, carry=idle)
