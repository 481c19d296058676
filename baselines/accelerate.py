"""HF Accelerate big-model offload (`device_map="auto"`): whole layers resident in layer order, the rest
copied in for each use and dropped after it.

Source: huggingface/accelerate `infer_auto_device_map` (src/accelerate/utils/modeling.py, commit
cdde654039): modules are placed in module order on the GPU until `max_memory` is reached, whole decoder
layers at a time (`no_split_module_classes`), after reserving room for the largest layer so an offloaded
layer can be brought in to run; offloaded modules carry hooks that copy their weights to the GPU before
`forward` and free them afterwards. No expert cache, no prefetch, no CPU compute. MoE-SpAc Table 1 row
"Accelerate".

Modelled as (baselines/_common.StreamedLayers): the first `(capacity - staging) // E` layers resident,
`staging` slots (default E, the reserved largest layer) for the copies, whose victim is the least recently
used staged expert, so copies do not persist as a cache across steps unless the offloaded layers' loads of
one step fit in the staging area. An offloaded layer moves whole: transformers 5 stores a layer's experts
fused (one `gate_up_proj` / `down_proj` tensor per layer), so the hook copies all E experts per forward,
routed or not (`LayerPlan.carry`); vLLM's UVA reads (baselines/vllm_offload.py) touch only the routed ones.
Deviation: a load that finds no slot (capacity < one layer) runs on the host, where Accelerate would run out
of memory.
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
