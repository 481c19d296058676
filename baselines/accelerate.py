"""HF Accelerate big-model offload (`device_map="auto"`): whole layers resident in layer order, the rest
copied in for each use and dropped after it.

Source: huggingface/accelerate `infer_auto_device_map` (src/accelerate/utils/modeling.py, commit
cdde654039): modules are placed in module order on the GPU until `max_memory` is reached, whole decoder
layers at a time (`no_split_module_classes`), after reserving room for the largest layer so an offloaded
layer can be brought in to run; offloaded modules carry hooks that copy their weights to the GPU before
`forward` and free them afterwards. No expert cache, no prefetch, no CPU compute. MoE-SpAc Table 1 row
"Accelerate".

Modelled as (baselines/_common.StreamedLayers): the first `(capacity - staging) // E` layers resident,
`staging` slots (default E, the reserved largest layer) for on-demand copies whose victim is the least
recently used staged expert, so copies do not persist as a cache across steps unless the offloaded
layers' loads of one step fit in the staging area. Deviations: only the activated experts cross the link
(transformers 5 stores a layer's experts fused, so the real hook copies the whole layer: E experts
per offloaded layer per forward; the interface cannot express loading experts that do not run, so that
cost belongs to a cost model); a load that finds no slot (capacity < one layer) runs on the host, where
Accelerate would run out of memory.
"""

from __future__ import annotations

from baselines._common import StreamedLayers


class Accelerate(StreamedLayers):
    name = "accelerate"
    lossless = True
    needs_draft = False
    requires = ()
    source = "huggingface/accelerate infer_auto_device_map + offload hooks (cdde654039); MoE-SpAc Table 1"
    keep_first_layers = True
