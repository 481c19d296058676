"""The method catalogue: which policy each paper table row is, whether it decodes with a draft, and the paper's
name for it. (The checks a workflow config gets before any job runs are in moespac/workflow_checks.py.)

A *method* is a row of a paper table: a policy spec from the registry plus whether it decodes with a draft
(speculative decoding, SD) or without one (autoregressive, AR). Its trace must match: an SD method replays a
trace recorded with the draft, an AR method one recorded without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moespac.errors import MoespacError


@dataclass(frozen=True)
class Method:
    """One row of a paper table."""

    policy: str
    """Policy spec for `make_policy` (name[:key=value,...])."""
    label: str
    """The paper's name for the row (matches moespac/reference/*.csv)."""
    draft: bool
    """True: speculative decoding with the draft; False: autoregressive decoding."""


METHODS: dict[str, Method] = {
    # Table 1 (Section 4.2); SD or AR as the paper ran each system
    "accelerate": Method("accelerate", "Accelerate", False),
    "vllm": Method("vllm-offload", "vLLM", False),
    "llamacpp": Method("llamacpp", "llama.cpp", False),
    "llamacpp-sd": Method("llamacpp-sd", "llama.cpp-w/ SD", True),
    # llama.cpp's other placement, likely the paper's: every layer's routed experts on the CPU (`-ot exps=CPU`,
    # i.e. --cpu-moe); the rows above keep as many whole layers' experts on the GPU as fit (--n-cpu-moe N)
    "llamacpp-cpu-moe": Method("llamacpp:cpu_moe=true", "llama.cpp -ot exps=CPU", False),
    "llamacpp-cpu-moe-sd": Method("llamacpp-sd:cpu_moe=true", "llama.cpp-w/ SD -ot exps=CPU", True),
    "mixtral-offload": Method("mixtral-offloading", "Mixtral Offload", False),
    "moe-infinity": Method("moe-infinity", "MoE-Infinity", False),
    "specexp": Method("specexp", "SpecExp", False),
    "moe-speq": Method("moe-speq", "MoE-SpeQ", True),
    "sp-moe": Method("sp-moe", "SP-MoE", True),
    "fate": Method("fate", "Fate", False),
    "hybrimoe": Method("hybrimoe", "HybriMoE", False),
    "moespac": Method("moespac", "MoE-SpAc", True),
    # Table 2 (Section 4.4): one component removed each
    "moespac-no-specue": Method("moespac:ablation=no-specue", "w/o SpecUE", True),
    "moespac-no-adabc": Method("moespac:ablation=no-adabc", "w/o AdaBC", True),
    "moespac-no-hetwb": Method("moespac:ablation=no-hetwb", "w/o HetWB", True),
    "moespac-no-sg-prefetcher": Method("moespac:ablation=no-sg-prefetcher", "w/o SG-Prefetcher", True),
    "moespac-no-sg-evictor": Method("moespac:ablation=no-sg-evictor", "w/o SG-Evictor", True),
    "moespac-no-sd": Method("moespac:ablation=no-sd", "w/o SD (AR Mode)", False),
    # the released code's constants (K=5, theta 5/1, tau=1) instead of the paper's
    "moespac-released": Method("moespac:variant=released-code", "MoE-SpAc (released code)", True),
    # references: not in the paper's tables
    "lru": Method("lru", "LRU (reference)", False),
    "lru-sd": Method("lru", "LRU w/ SD (reference)", True),
    "oracle-sd": Method("oracle", "Offline oracle w/ SD (reference)", True),
}

# Table 2 calls the full system "MoE-SpAc (Full)"
TABLE2_LABELS = {"moespac": "MoE-SpAc (Full)"}

_K_SWEEP = re.compile(r"^(?P<base>[a-z0-9-]+)-k(?P<K>[0-9]+)$")


COINCIDENCES: dict[frozenset, str] = {
    frozenset({"mixtral-offload", "moe-infinity"}):
        "both fetch every miss on demand into a cache of the same size, with no prefetch (MoE-Infinity's released "
        "decode path prefetches nothing); they differ only in which expert leaves (per-layer LRU vs global "
        "in-cache LFU), and where routing is near-uniform those choices evict alike",
    frozenset({"llamacpp-sd", "moespac-released"}):
        "the released code is a llama.cpp fork whose fixed thresholds (K = 5, tau = 1) leave most activated "
        "experts on the CPU, close to llama.cpp's static split with the same draft",
}
"""Pairs of Table 1 rows whose systems differ but whose mechanisms coincide on some workloads, and why: a table
whose intervals cannot tell such a pair apart says so with this reason (moespac/analysis/tables.py)."""


def get_method(slug: str) -> Method:
    """A catalogue method, or a K-sweep variant `<moespac method>-k<K>` (e.g. moespac-k6)."""
    if slug in METHODS:
        return METHODS[slug]
    m = _K_SWEEP.match(slug)
    if m and m["base"] in METHODS and METHODS[m["base"]].policy.startswith("moespac"):
        base = METHODS[m["base"]]
        sep = "," if ":" in base.policy else ":"
        return Method(f"{base.policy}{sep}K={int(m['K'])}", f"{base.label} K={int(m['K'])}", base.draft)
    raise MoespacError(f"unknown method {slug!r}; known: {', '.join(METHODS)} (or <moespac method>-k<K>)")


def k_method(K: int, base: str = "moespac") -> str:
    return f"{base}-k{K}"


def paper_label(slug: str) -> str:
    return get_method(slug).label
