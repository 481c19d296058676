"""SpecExp ("Speculating Experts"): at layer l, speculate layer l+1's top-k experts, copy their rows into one of
a few rotating GPU buffer sets while layer l computes, and run the speculated experts (lossy): layer l+1's
router is not consulted. Nothing is cached across forwards.

Stand-in: the recorded cross-layer router prediction (signal 'cross_layer_topk') replaces the quasi hidden
state built from offline default vectors. `lossy_execution=False` (a variant) loads unspeculated experts on
demand instead. MoE-SpAc Table 1 row "SpecExp".

Provenance and upstream details: docs/baselines.md#specexp.
"""

from __future__ import annotations

import numpy as np

from baselines._common import PrefetchLRU, ranked_prediction
from moespac.errors import MoespacError
from moespac.policy import LayerPlan, Prefetch


class SpecExp(PrefetchLRU):
    name = "specexp"
    lossless = False
    needs_draft = False
    requires = ("cross_layer_topk",)
    source = ("axonn-ai/yalis offload_prefetch @b1970f7881 (external/model.py, offloading/manager.py, "
              "offloading/buffer_manager.py); arXiv 2603.19289; MoE-SpAc Table 1")
    stand_in = ("the recorded cross-layer router prediction replaces SpecExp's quasi hidden state from offline "
                "default vectors; the prefetch starts after layer l, not after its attention")

    variants = {"lossy_execution=false": "routed experts that were not speculated are loaded on demand (exact output)"}

    def __init__(self, lossy_execution: bool = True, prefetch_layers: int = 1):
        if prefetch_layers < 1:
            raise MoespacError(f"policy {self.name!r}: prefetch_layers must be >= 1, got {prefetch_layers}")
        self.lossy_execution = bool(lossy_execution)
        """Run the speculated experts in place of the routed ones (upstream's default-vector path); False = load
        the routed experts that were not speculated (exact output)."""
        self.lossless = not self.lossy_execution
        self.prefetch_layers = int(prefetch_layers)
        """`num_prefetch_layers`: the device holds this many plus one buffer sets of E expert rows."""

    def device_slots(self, topology, capacity):
        return min(capacity, (self.prefetch_layers + 1) * topology.num_experts)

    def reset(self, ctx):
        placement = super().reset(ctx)
        self.step = None
        self.predicted = np.zeros((ctx.topology.num_layers, ctx.topology.num_experts), dtype=bool)
        self.ran_as_predicted = self.substituted = self.routed = 0
        return placement

    def begin_step(self, step, cache):
        self.step = step
        self.predicted[:] = False
        return []

    def plan_layer(self, layer, counts, cache) -> LayerPlan:
        if self.step is not None and self.step.kind == "prefill":  # upstream copies whole layers in prefill
            plan = super().plan_layer(layer, counts, cache)
            rest = np.flatnonzero(~cache.resident[layer] & (counts == 0))
            return LayerPlan(load=plan.load, carry=rest)
        if layer == 0 or not self.lossy_execution:  # layer 0 has no speculation: its own router decides
            return super().plan_layer(layer, counts, cache)
        self.clock += 1
        pred, active = self.predicted[layer], counts > 0
        self.last_use[layer, pred | active] = self.clock
        self.routed += int(np.count_nonzero(active))
        self.ran_as_predicted += int(np.count_nonzero(active & pred))
        self.substituted += int(np.count_nonzero(active & ~pred))
        overtaken = np.flatnonzero(pred & ~cache.resident[layer])  # its copy had not started: wait for it
        return LayerPlan(load=overtaken[active[overtaken]], carry=overtaken[~active[overtaken]],
                         substitute=np.flatnonzero(active & ~pred & ~cache.resident[layer]))

    def end_layer(self, layer, counts, cache) -> list[Prefetch]:
        if layer + 1 >= self.ctx.topology.num_layers:
            return []
        order, votes = ranked_prediction(self.step, layer, self.ctx.topology.num_experts, self.name)
        self.predicted[layer + 1, order] = True
        self.touch((layer + 1, int(e)) for e in order)
        return [Prefetch(layer + 1, int(e), float(votes[e])) for e in order if not cache.resident[layer + 1, e]]

    def describe(self) -> dict:
        return {"buffer_slots": (self.prefetch_layers + 1) * self.ctx.topology.num_experts,
                "routed_after_layer0": self.routed, "ran_as_predicted": self.ran_as_predicted,
                "ran_as_substitute": self.substituted,
                "prefetch_accuracy": self.ran_as_predicted / self.routed if self.routed else None}
