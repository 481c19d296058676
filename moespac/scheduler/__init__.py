"""MoE-SpAc's scheduler: the policy (policy.py) and its parts, estimator, balancer, eviction pool (one file each)."""

from moespac.scheduler.balancer import WorkloadBalancer
from moespac.scheduler.config import ABLATIONS, VARIANTS, MoESpAcConfig
from moespac.scheduler.estimator import SlidingCounts, UtilityEstimator
from moespac.scheduler.evictor import EvictionPool
from moespac.scheduler.policy import MoESpAc

__all__ = ["MoESpAc", "MoESpAcConfig", "VARIANTS", "ABLATIONS", "UtilityEstimator", "WorkloadBalancer",
           "EvictionPool", "SlidingCounts"]
