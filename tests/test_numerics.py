"""Table 6 (moespac/numerics.py) can fail: the hybrid layer's NMSE against the stock transformers block stays
within the paper's bound in fp32 and in bf16, and a host kernel perturbed by 1 % (a negative control) breaks it."""

from __future__ import annotations

from moespac.engine import hybrid
from moespac.numerics import PAPER_WORST_NMSE, run_numerics

SMALL = dict(experts=(8,), top_ks=(2,), tokens=(7,), cache_ratios=(0.5,), realistic=False)


def test_the_hybrid_layer_meets_the_papers_bound_and_a_perturbed_host_kernel_does_not(monkeypatch):
    [ok] = run_numerics(**SMALL)
    assert ok["worst_nmse"] <= PAPER_WORST_NMSE and ok["worst_nmse_bf16"] <= PAPER_WORST_NMSE
    # bf16 rounds: against fp32 arithmetic it is above the bound, and the hybrid adds nothing to the stock block's
    assert ok["bf16_rounding"] == ok["stock_bf16_rounding"] > PAPER_WORST_NMSE
    real = hybrid.HybridRuntime._rows_to_device  # only the host experts' rows come back through it
    monkeypatch.setattr(hybrid.HybridRuntime, "_rows_to_device", lambda self, y: real(self, y * 1.01))
    [bad] = run_numerics(**SMALL)
    assert bad["worst_nmse"] > PAPER_WORST_NMSE and bad["worst_nmse_bf16"] > PAPER_WORST_NMSE, bad
    assert bad["bf16_rounding"] > bad["stock_bf16_rounding"]
