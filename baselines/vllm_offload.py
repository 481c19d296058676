"""vLLM `--cpu-offload-gb X`: the first X GiB of parameters live in host memory and are streamed to the
GPU on every forward; the remaining layers are resident.

Modelled with baselines/_common.StreamedLayers: the last layers resident, the offloaded layers' activated
experts loaded on demand into a staging area and dropped after use. MoE-SpAc Table 1 row "vLLM".

Provenance and upstream details: docs/baselines.md#vllm-cpu-offload.
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
