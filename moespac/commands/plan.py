"""`moespac plan`: the memory plan of a run, from the model configs alone (no weights are read)."""

from __future__ import annotations

from moespac.atomic import write_json
from moespac.commands._common import add_memory_args
from moespac.configargs import add_field_args
from moespac.errors import MoespacError
from moespac.iopaths import IO


def register(sub) -> None:
    from moespac.engine.session import EngineConfig

    p = sub.add_parser("plan", help="device and host memory of a run and the slot count that fits, before loading",
                       description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True,
                   help="target MoE model: local folder or hub id (the paper's are known offline)")
    p.add_argument("--draft", default=None, help="draft model: local folder or hub id")
    p.add_argument("--dtype", default="auto", help="auto (the checkpoint's), fp32, bf16, fp16 or fp64")
    p.add_argument("--device", default=None, choices=["cuda", "cpu"],
                   help="plan for a GPU run (default when --gpu-gib is given or CUDA is here) or a CPU run")
    add_field_args(p, EngineConfig, "context", "batch_size", "gamma", "trust_remote_code")
    add_memory_args(p)
    p.add_argument("--json", default=None, metavar="FILE",
                   help="also write the verdict as JSON (atomically); a plan that cannot fit is then recorded "
                        "(fits: false, with the reason) and the command succeeds; the workflow makes the same verdict "
                        "(moespac.engine.session.plan_verdict) to pick a Table 3 model's own trace or its fallback")
    p.set_defaults(func=run, io=IO(outputs=("json",), inputs=("target", "draft")))


def check_context_fits(args) -> None:
    """An explicit --context longer than the target's positions is refused (the engine's own calls clamp theirs)."""
    from moespac.models.hub_configs import load_config

    config = load_config(args.target, args.trust_remote_code, "target")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    longest = getattr(text, "max_position_embeddings", None)
    if longest is not None and args.context > longest:
        raise MoespacError(f"--context {args.context} is longer than the target's {longest} positions "
                           "(max_position_embeddings)")


def run(args) -> int:
    import torch

    from moespac.engine.session import EngineConfig, plan_for, plan_verdict

    device = args.device or ("cuda" if args.gpu_gib is not None or torch.cuda.is_available() else "cpu")
    if device == "cuda" and args.gpu_gib is None and not torch.cuda.is_available():
        raise MoespacError("--gpu-gib: give the GPU's memory (no CUDA device here to read it from)")
    check_context_fits(args)
    cfg = EngineConfig(target=args.target, draft=args.draft, dtype=args.dtype, trust_remote_code=args.trust_remote_code,
                       cache_ratio=args.cache_ratio, cache_gib=args.cache_gib, gpu_gib=args.gpu_gib,
                       host_gib=args.host_gib, context=args.context, batch_size=args.batch_size, gamma=args.gamma)
    if not args.json:
        plan = plan_for(cfg, device)  # a plan that cannot fit fails here, in one line
    else:
        plan, verdict = plan_verdict(cfg, device)
        write_json(args.json, verdict)
        if plan is None:
            print(f"does not fit: {verdict['reason']} (recorded in {args.json})")
            return 0
    print(plan.render())
    print(f"fits: {plan.slots} expert slots, cache ratio {plan.cache_ratio:.3f}; host peak "
          f"{plan.host_peak / 2**30:.2f} GiB")
    return 0
