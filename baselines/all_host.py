"""All routed experts on the host: llama.cpp `-ot exps=CPU` / `--cpu-moe`.

Source: ggml-org/llama.cpp `--cpu-moe` (PR #14992): routed expert tensors live in a CPU buffer and,
for batches under 32 tokens, are computed by the CPU; attention, router and shared experts stay on
the device. No cache, no prefetch.
"""

from __future__ import annotations

from moespac.policy import Policy


class AllHost(Policy):
    name = "all-host"
    lossless = True
    needs_draft = False
    source = "llama.cpp --cpu-moe (ggml-org/llama.cpp PR #14992)"
