"""vLLM `--cpu-offload-gb X`: the first X GiB of parameters live in host memory and are streamed to the
GPU on every forward; the remaining layers are resident.

Source: vllm-project/vllm `maybe_offload_to_cpu` (vllm/model_executor/models/utils.py, PR #6496; e.g. at
commit 82fbeae92b): `make_layers` wraps the layers in order and offloads parameters until X bytes are
reached, so the *first* layers are the offloaded ones (the brief said "first layers resident"; the code
says the opposite, and we follow the code). V1 reads offloaded weights in place over UVA (zero-copy);
older versions copied the layer's state dict to the GPU for each forward. Routing plays no part and there
is no expert cache or CPU compute. MoE-SpAc Table 1 row "vLLM" (run with `--cpu-offload-gb 60`).

Modelled as (baselines/_common.StreamedLayers): the last `(capacity - staging) // E` layers resident; the
offloaded layers' activated experts are loaded on demand into a staging area (default E slots: one
layer, what the copying path needs) and dropped after use (least recently used staged expert is the
victim). UVA zero-copy reads are thereby counted as copies of the routed experts (the spec infers, but
did not verify, that the fused-MoE kernel touches only routed experts' slices). Not modelled: the newer
`prefetch` offloader that copies the next layer ahead.
"""

from __future__ import annotations

from baselines._common import StreamedLayers


class VLLMOffload(StreamedLayers):
    name = "vllm-offload"
    lossless = True
    needs_draft = False
    requires = ()
    source = "vllm-project/vllm --cpu-offload-gb, maybe_offload_to_cpu (PR #6496, 82fbeae92b); MoE-SpAc Table 1"
    keep_first_layers = False
