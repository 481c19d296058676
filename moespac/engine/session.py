"""One engine session: plan the memory, load a pair, build the hybrid runtime, run requests, record traces.

generate, bench, proxy-stats, check-lossless and calibrate all go through it. The memory plan runs on the
model configs before anything is loaded, so a run that cannot fit is refused in one line; the slot count
comes from the plan unless --cache-ratio / --cache-gib ask for one (checked against it). Loading follows
the plan's order: the target on the host, its experts into the expert store layer by layer (the rest to the
device), then the draft straight to the device.
"""

from __future__ import annotations

import re

import os
from dataclasses import dataclass, replace

from moespac.cache import CacheSize
from moespac.errors import MoespacError


@dataclass(frozen=True)
class EngineConfig(CacheSize):
    """What a session loads and how its engine runs (its cache: CacheSize's fields)."""

    target: str
    """Target MoE model: local folder or hub id."""
    draft: str | None = None
    """Draft model: local folder or hub id; None = autoregressive decoding."""
    dtype: str = "auto"
    """Model dtype: auto, fp32, bf16, fp16 or fp64."""
    device: str | None = None
    """Device of non-expert weights and the slot pool; None = cuda if available, else cpu."""
    trust_remote_code: bool = False
    """Allow model code from the hub."""
    policy: str = "lru"
    """Scheduling policy, name[:key=value,...]."""
    copy_mode: str = "async"
    """Prefetch copies on a worker thread ('async') or at the end of the asking layer ('sync')."""
    gpu_gib: float | None = None
    """Device memory budget; None = the GPU's free memory (a CPU run has no separate device budget)."""
    host_gib: float | None = None
    """Host memory budget; None = this machine's physical memory."""
    context: int = 4096
    """Longest sequence (prompt + new tokens) the KV cache is planned for."""
    batch_size: int = 1
    """Sequences decoded together."""
    gamma: int = 8
    """Draft length the plan sizes verify batches for."""

    def __post_init__(self):
        super().__post_init__()
        for key in ("gpu_gib", "host_gib"):
            if getattr(self, key) is not None and getattr(self, key) < 0:
                raise MoespacError(f"{key} {getattr(self, key)} must be >= 0")
        if self.context < 1 or self.batch_size < 1 or self.gamma < 0:
            raise MoespacError("context and batch_size must be >= 1, gamma >= 0")


def resolve_device(device: str | None) -> str:
    import torch

    if device:
        if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
            raise MoespacError(f"--device {device!r}: expected cpu, cuda or cuda:N")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise MoespacError(f"--device {device}: CUDA is not available on this machine")
        if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
            raise MoespacError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def host_memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def plan_for(cfg: EngineConfig, device: str):
    """The memory plan of `cfg` from the model configs alone (raises MoespacError when it cannot fit)."""
    import torch

    from moespac.engine.plan import model_shape, plan_memory
    from moespac.models.hub_configs import load_config
    from moespac.models.loading import DTYPES

    dtype = DTYPES.get(cfg.dtype, "auto")
    dtype = None if dtype == "auto" else dtype
    target_config = load_config(cfg.target, cfg.trust_remote_code, "target")
    target = model_shape(target_config, dtype, cfg.target)
    draft = model_shape(load_config(cfg.draft, cfg.trust_remote_code, "draft"), dtype, cfg.draft) if cfg.draft else None
    longest = getattr(target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config,
                      "max_position_embeddings", None) or cfg.context
    cuda = device.startswith("cuda")
    gpu = cfg.gpu_gib
    if gpu is None and cuda:
        gpu = torch.cuda.mem_get_info(torch.device(device))[0] / 2**30
    return plan_memory(target, draft, device_gib=gpu if cuda else None,
                       host_gib=cfg.host_gib if cfg.host_gib is not None else host_memory_gib(),
                       context=min(cfg.context, longest), batch=cfg.batch_size, gamma=cfg.gamma if cfg.draft else 0,
                       cuda=cuda, cache=cfg)


def plan_verdict(cfg: EngineConfig, device: str) -> tuple[object | None, dict]:
    """(the plan or None, its verdict as JSON-able facts): fits, or the one-line reason it does not (a plan
    that cannot fit is an answer here; a bad model name still raises). Budgets left None are this machine's."""
    from moespac.engine.plan import DoesNotFit

    verdict = dict(target=cfg.target, draft=cfg.draft, device=device, gpu_gib=cfg.gpu_gib, host_gib=cfg.host_gib,
                   cache_ratio=cfg.cache_ratio, batch_size=cfg.batch_size,
                   gamma=cfg.gamma if cfg.draft else 0)  # as planned
    try:
        plan = plan_for(cfg, device)
    except DoesNotFit as e:
        return None, dict(verdict, fits=False, reason=str(e))
    return plan, dict(verdict, fits=True, reason=None, slots=plan.slots, total_slots=plan.total_slots,
                      cache_ratio=plan.cache_ratio, device_total=plan.device_total, host_peak=plan.host_peak)


class EngineSession:
    """A loaded pair on its runtime; `open(cfg)` plans and loads, `EngineSession(models...)` wraps loaded ones."""

    def __init__(self, target, draft, tokenizer, cfg: EngineConfig, plan=None, device=None, costs=None):
        from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
        from moespac.registry import make_policy

        self.cfg, self.plan = cfg, plan
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        rc = RuntimeConfig(cache_ratio=cfg.cache_ratio if cfg.cache_ratio is not None else 0.5,
                           cache_gib=cfg.cache_gib, per_layer=cfg.per_layer, copy_mode=cfg.copy_mode,
                           slots=plan.slots if plan is not None else None)
        self.runtime = HybridRuntime(target, make_policy(cfg.policy), rc,
                                     device=device or resolve_device(cfg.device), costs=costs)
        if draft is not None:
            draft.to(self.runtime.device.torch_device)

    @classmethod
    def open(cls, cfg: EngineConfig, log=None) -> "EngineSession":
        """Plan (refusing before any loading when it cannot fit), then load the pair."""
        from moespac.models.loading import check_pair, load_model, load_tokenizer

        device = resolve_device(cfg.device)
        plan = plan_for(cfg, device)
        if log:
            log(plan.render())
        target = load_model(cfg.target, "target", cfg.dtype, "cpu", cfg.trust_remote_code)
        tokenizer = load_tokenizer(cfg.target, "target tokenizer", cfg.trust_remote_code)
        session = cls(target, None, tokenizer, cfg, plan, device)
        if cfg.draft:
            draft = load_model(cfg.draft, "draft", cfg.dtype, session.runtime.device.torch_device,
                               cfg.trust_remote_code)
            check_pair(target, draft, cfg.target, cfg.draft)
            session.draft = draft
        return session

    @property
    def topology(self):
        return self.runtime.topology

    def generate(self, prompts: list[list[int]], *, gamma: int, max_new_tokens: int, sampling, request: int = 0,
                 ignore_eos: bool = False, signals=(), warmup_counts=None, history=None, max_batch: int | None = None):
        """One engine call (a cold cache, one request of the trace): returns (results, runtime stats)."""
        from moespac.engine import speculative

        draft = self.draft if gamma > 0 else None
        sig = set(signals) | ({"draft"} if draft is not None else set())
        self.runtime.start_request(gamma=gamma if draft is not None else 0, batch_size=len(prompts), signals=sig,
                                   warmup_counts=warmup_counts, history=history)
        eos = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None
        results = speculative.generate_batch(self.target, prompts, draft=draft, gamma=gamma,
                                             max_new_tokens=max_new_tokens, sampling=sampling, runtime=self.runtime,
                                             eos_token_id=eos, request=request, ignore_eos=ignore_eos,
                                             max_batch=max_batch or max(len(prompts), 1))
        return results, self.runtime.stats()

    def record(self, model_spec: dict, meta: dict | None = None, cross_layer: bool = True, self_draft: bool = False):
        """Start recording a trace of the following calls; `finish_trace()` returns it."""
        from moespac.trace import TraceRecorder

        self.runtime.recorder = TraceRecorder(self.topology, model_spec, meta=meta, cross_layer=cross_layer,
                                              self_draft=self_draft)
        return self.runtime.recorder

    def finish_trace(self, **meta):
        recorder, self.runtime.recorder = self.runtime.recorder, None
        return recorder.finish(**meta)

    def close(self) -> None:
        self.runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def config_from_args(args, **overrides) -> EngineConfig:
    """An EngineConfig from the shared model and engine flags (moespac.commands._common)."""
    fields = dict(target=args.target, draft=getattr(args, "draft", None), dtype=args.dtype, device=args.device,
                  trust_remote_code=args.trust_remote_code, policy=getattr(args, "policy", "lru"),
                  cache_ratio=getattr(args, "cache_ratio", None), cache_gib=getattr(args, "cache_gib", None),
                  per_layer=getattr(args, "per_layer", False), copy_mode=getattr(args, "copy_mode", "async"),
                  gpu_gib=getattr(args, "gpu_gib", None), host_gib=getattr(args, "host_gib", None))
    return replace(EngineConfig(**fields), **overrides)
