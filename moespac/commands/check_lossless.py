"""`moespac check-lossless`: greedy speculative output == Hugging Face's greedy generate(), for every combination."""

from __future__ import annotations

from moespac.commands._common import add_memory_args, add_model_args, floats, ints
from moespac.errors import MoespacError, check_unit_interval


def register(sub) -> None:
    p = sub.add_parser("check-lossless", help="verify greedy speculative decoding on the hybrid engine is lossless")
    add_model_args(p, draft_required=True)
    p.add_argument("--prompts", type=int, default=20, help="number of built-in prompts")
    p.add_argument("--gammas", type=ints, default=[1, 4, 8])
    p.add_argument("--cache-ratios", type=floats, default=[0.0, 0.5, 1.0])
    p.add_argument("--batch-sizes", type=ints, default=[1], help="batch sizes: prompts are decoded B at a time")
    p.add_argument("--policy", default="lru")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--reference", default="stock", choices=["stock", "host"],
                   help="stock: HF generate() on the stock model, run on the host before the engine takes the experts; "
                        "host: HF generate() over the engine with every expert on the host (faster on a GPU)")
    add_memory_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from tqdm import tqdm

    from moespac.commands.generate import encode_prompt
    from moespac.engine.session import EngineSession, config_from_args, plan_for, resolve_device
    from moespac.lossless import check_session, hf_greedy
    from moespac.models.loading import load_pair
    from moespac.prompts import builtin_prompts

    if any(g < 1 for g in args.gammas):
        raise MoespacError(f"--gammas {args.gammas}: every gamma must be >= 1")
    for r in args.cache_ratios:
        check_unit_interval("--cache-ratios: a ratio", r)
    if args.prompts < 1:
        raise MoespacError(f"--prompts {args.prompts} must be >= 1")
    if any(b < 1 for b in args.batch_sizes):
        raise MoespacError(f"--batch-sizes {args.batch_sizes}: every batch size must be >= 1")
    # the plan is checked at the largest ratio asked for: every ratio must fit next to the rest
    cfg = config_from_args(args, cache_ratio=max(args.cache_ratios), gamma=max(args.gammas),
                           batch_size=max(args.batch_sizes), context=args.max_new_tokens + 1024)
    device = resolve_device(cfg.device)
    plan = plan_for(cfg, device)
    target, draft, tok = load_pair(args.target, args.draft, args.dtype, "cpu", args.trust_remote_code)
    prompts = [encode_prompt(tok, t) for t in builtin_prompts(args.prompts)]
    expected = hf_greedy(target, prompts, args.max_new_tokens) if args.reference == "stock" else None
    total = len(prompts) * len(args.gammas) * len(args.cache_ratios) * len(args.batch_sizes)
    with EngineSession(target, draft, tok, cfg, plan, device) as session, \
            tqdm(total=total, desc="check-lossless", unit="run", leave=False) as bar:
        n, bad = check_session(session, prompts, args.gammas, args.cache_ratios, args.policy, args.max_new_tokens,
                               bar.update, args.batch_sizes, expected)
    combos = (f"{len(prompts)} prompts x batch sizes {args.batch_sizes} x gammas {args.gammas} x cache ratios "
              f"{args.cache_ratios}, {args.max_new_tokens} tokens each; reference: HF generate() "
              f"({'stock model' if args.reference == 'stock' else 'every expert on the host'})")
    if bad:
        for m in bad[:20]:
            print(f"MISMATCH prompt {m.prompt} batch {m.batch_size} gamma {m.gamma} cache ratio {m.cache_ratio}: "
                  f"first differs at token {m.position} (HF generate {m.expected}, speculative {m.got})")
        print(f"FAIL: {len(bad)}/{n} runs differ ({combos})")
        return 1
    print(f"OK: greedy speculative output equals HF greedy generate() token for token in all {n} sequences ({combos})")
    return 0
