"""MoE-SpAc configuration: the paper's defaults, the released code's, and the six ablations.

Fields left at None take their value from the variant (and then the ablations) in `resolved()`; a field
set explicitly that an ablation would change differently is an error, so `ablation=no-specue,K=6`
cannot silently stop being the ablation. Tags: [paper] stated in arXiv 2603.09983, [code] read in
lshAlgorithm/MoE-SpAc @77bb9cf, [inferred] our reconstruction (spec/moespac-algorithm.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from moespac.errors import MoespacError
from moespac.hashing import stable_hash

# What each variant fixes; everything else keeps the field defaults below.
VARIANTS = {
    # [paper] Sec 3.2-3.4: K=4, boundaries start at floor(gamma/2) and adapt, tau solved per layer and step.
    "paper": dict(K=4, theta_up=None, theta_down=None, adaptive=True, tau=None,
                  prefetcher="utility", evictor="utility", decoding="sd"),
    # [code] gb.cpp: TOP_STAT=5, StateMachine(5, 1) never recalibrated, threshold fixed at 1.
    "released-code": dict(K=5, theta_up=5.0, theta_down=1.0, adaptive=False, tau=1,
                          prefetcher="utility", evictor="utility", decoding="sd"),
}

# [paper] Sec 4.4: each ablation removes one component; here it changes exactly these fields.
ABLATIONS = {
    "no-specue": dict(K=1),  # binary utility
    "no-adabc": dict(adaptive=False, theta_up=3.0, theta_down=1.0),  # fixed boundaries 3 / 1
    "no-hetwb": dict(tau=2),  # static threshold instead of the balancer
    "no-sg-prefetcher": dict(prefetcher="static"),  # most frequent experts of a warm-up window, never moved
    "no-sg-evictor": dict(evictor="none"),  # keep experts until the cache is full
    "no-sd": dict(decoding="ar"),  # autoregressive; f over a sliding window of `ar_window` tokens
}

_CHOICES = {
    "calibrate_order": ("after", "before"),
    "theta_rounding": ("round", "floor", "none"),
    "theta_scope": ("expert", "layer"),
    "count_mode": ("batch", "accepted"),
    "update_at": ("layer", "step"),
    "tau_scope": ("layer", "global"),
    "cost_tokens": ("gamma", "batch"),
    "prefetcher": ("utility", "static"),
    "evictor": ("utility", "none"),
    "decoding": ("sd", "ar"),
}


@dataclass(frozen=True)
class MoESpAcConfig:
    """Every knob of the MoE-SpAc scheduler; see the module docstring for how defaults resolve."""

    variant: str = "paper"
    """'paper' (K=4, adaptive theta, solved tau) or 'released-code' (K=5, theta 5/1, tau=1)."""
    ablation: str = ""
    """Ablations of Table 2, '+'-joined: no-specue, no-adabc, no-hetwb, no-sg-prefetcher, no-sg-evictor, no-sd."""
    K: int | None = None
    """Utility cap: u in {0..K}. [paper] 4, [code] 5."""
    theta_up: float | None = None
    """Initial up boundary; None = floor(gamma/2) [paper]. [code] 5."""
    theta_down: float | None = None
    """Initial down boundary; None = floor(gamma/2) [paper]. [code] 1."""
    adaptive: bool | None = None
    """Adaptive boundary calibration (moving average of the fluctuations) [paper]; absent in [code]."""
    lam: float = 0.1
    """Forgetting factor lambda of the calibration, in (0, 1] [paper Sec 4.1]."""
    theta_floor: float = 1.0
    """Lower bound on both boundaries; without it theta -> 0 and u flips every step [inferred]."""
    theta_rounding: str = "round"
    """Compare the integer delta with the boundary rounded: 'round' (half up), 'floor', or 'none' (the float
    as is, i.e. ceil; then an idle expert never decays, see estimator.py) [inferred]."""
    calibrate_order: str = "after"
    """Calibrate the boundaries 'after' or 'before' the transition of the same step [inferred]."""
    theta_scope: str = "expert"
    """Boundaries per 'expert' or shared per 'layer' (mean of the layer's fluctuations) [inferred]."""
    count_mode: str = "batch"
    """f counts the whole verify 'batch' [code] or only 'accepted' tokens (driver calls observe_accepted)."""
    update_at: str = "layer"
    """Update utilities and request prefetches after each 'layer' [code], or for all layers at the 'step' end."""
    tau: int | None = None
    """Fixed threshold in 1..K; None = solved by the workload balancer [paper]. [code] 1."""
    tau_scope: str = "layer"
    """Balancer decides one tau per 'layer' and step, or one 'global' tau per step [inferred]."""
    warmup_steps: int = 8
    """Steps per layer that learn r_c, r_g by plain averaging before the balancer decides [inferred]."""
    warmup_tau: int = 1
    """Threshold used while the balancer warms up (the released code's tau) [inferred]."""
    rate_decay: float = 0.1
    """After warm-up, r_c and r_g follow a moving average with this weight (0 = frozen) [inferred]."""
    cost_tokens: str = "gamma"
    """Tokens in T_cpu: 'gamma' x batch as the paper writes (AR: the step's tokens), or the 'batch' size."""
    prefetcher: str | None = None
    """'utility': prefetch u >= tau in utility order [paper]; 'static': warm-up placement, never moved."""
    static_warmup_steps: int = 16
    """Static placement: decode steps whose counts pick the experts (unless warmup_counts is given)."""
    evictor: str | None = None
    """'utility': evict the lowest utility below tau [paper]; 'none': keep experts, refuse when full."""
    decoding: str | None = None
    """'sd' (needs a draft) or 'ar': autoregressive, f summed over a sliding window [paper Sec 4.4]."""
    ar_window: int = 10
    """Tokens (AR steps) in the sliding window of the 'ar' mode [paper Sec 4.4]."""
    update_on_prefill: bool = False
    """Update utilities on the prefill forward too; [code] skips batches of 32+ tokens."""

    def ablations(self) -> tuple[str, ...]:
        return tuple(a for a in self.ablation.replace(" ", "").split("+") if a)

    def resolved(self) -> "MoESpAcConfig":
        """Fill variant and ablation fields, normalise `ablation`, and validate."""
        if self.variant not in VARIANTS:
            raise MoespacError(f"moespac config key 'variant': unknown {self.variant!r}; one of {', '.join(VARIANTS)}")
        for a in self.ablations():
            if a not in ABLATIONS:
                raise MoespacError(f"moespac config key 'ablation': unknown {a!r}; one of {', '.join(ABLATIONS)}")
        values = {k: v for k, v in VARIANTS[self.variant].items() if getattr(self, k) is None}
        for a in self.ablations():
            for key, value in ABLATIONS[a].items():
                mine = getattr(self, key)
                if mine is not None and mine != value:
                    raise MoespacError(f"moespac config key {key!r}={mine!r} contradicts ablation {a!r} "
                                       f"({key}={value!r})")
                values[key] = value
        values["ablation"] = "+".join(sorted(set(self.ablations())))
        out = dataclasses.replace(self, **values)
        out.validate()
        return out

    def validate(self) -> None:
        """Raise MoespacError naming the first invalid key."""
        def bad(key, why):
            raise MoespacError(f"moespac config key {key!r}={getattr(self, key)!r}: {why}")

        if self.variant not in VARIANTS:
            bad("variant", f"unknown; one of {', '.join(VARIANTS)}")
        for a in self.ablations():
            if a not in ABLATIONS:
                bad("ablation", f"unknown {a!r}; one of {', '.join(ABLATIONS)}")
        if self.K is not None and (not _is_int(self.K) or not 1 <= self.K <= 127):
            bad("K", "must be an integer in 1..127")
        K = self.K if self.K is not None else VARIANTS[self.variant]["K"]
        if not (_is_num(self.lam) and 0 < self.lam <= 1):
            bad("lam", "forgetting factor must lie in (0, 1]")
        for key in ("theta_up", "theta_down"):
            v = getattr(self, key)
            if v is not None and not (_is_num(v) and 0 < v <= 1000):
                bad(key, "must be a number in (0, 1000]")
        if not (_is_num(self.theta_floor) and 0 <= self.theta_floor <= 1000):
            bad("theta_floor", "must be a number in [0, 1000]")
        for key in ("tau", "warmup_tau"):
            v = getattr(self, key)
            if v is not None and (not _is_int(v) or not 1 <= v <= K):
                bad(key, f"must be an integer in 1..K (K={K})")
        for key, choices in _CHOICES.items():
            v = getattr(self, key)
            if v is not None and v not in choices:
                bad(key, f"one of {', '.join(choices)}")
        for key, lo in (("warmup_steps", 0), ("static_warmup_steps", 1), ("ar_window", 1)):
            if not _is_int(getattr(self, key)) or getattr(self, key) < lo:
                bad(key, f"must be an integer >= {lo}")
        if not (_is_num(self.rate_decay) and 0 <= self.rate_decay <= 1):
            bad("rate_decay", "must lie in [0, 1]")
        for key in ("adaptive", "update_on_prefill"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), bool):
                bad(key, "must be true or false")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def compute_hash(self) -> str:
        """The resolved config's stable hash (moespac.hashing, as every config's)."""
        return stable_hash(self.resolved().to_dict())


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
