"""`moespac check-lossless`: greedy speculative output == greedy autoregressive output, for every combination."""

from __future__ import annotations

from moespac.commands._common import add_model_args, floats, ints, load_models
from moespac.errors import MoespacError


def register(sub) -> None:
    p = sub.add_parser("check-lossless", help="verify greedy speculative decoding on the hybrid engine is lossless")
    add_model_args(p, draft_required=True)
    p.add_argument("--prompts", type=int, default=20, help="number of built-in prompts")
    p.add_argument("--gammas", type=ints, default=[1, 4, 8])
    p.add_argument("--cache-ratios", type=floats, default=[0.0, 0.5, 1.0])
    p.add_argument("--batch-sizes", type=ints, default=[1], help="batch sizes: prompts are decoded B at a time")
    p.add_argument("--policy", default="lru")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.set_defaults(func=run)


def run(args) -> int:
    from tqdm import tqdm

    from moespac.commands.generate import encode_prompt
    from moespac.lossless import check_lossless
    from moespac.prompts import builtin_prompts

    if any(g < 1 for g in args.gammas):
        raise MoespacError(f"--gammas {args.gammas}: every gamma must be >= 1")
    if any(not 0 <= r <= 1 for r in args.cache_ratios):
        raise MoespacError(f"--cache-ratios {args.cache_ratios}: every ratio must be in [0, 1]")
    if args.prompts < 1:
        raise MoespacError(f"--prompts {args.prompts} must be >= 1")
    if any(b < 1 for b in args.batch_sizes):
        raise MoespacError(f"--batch-sizes {args.batch_sizes}: every batch size must be >= 1")
    target, draft, tok, device = load_models(args)
    prompts = [encode_prompt(tok, t) for t in builtin_prompts(args.prompts)]
    total = len(prompts) * len(args.gammas) * len(args.cache_ratios) * len(args.batch_sizes)
    with tqdm(total=total, desc="check-lossless", unit="run", leave=False) as bar:
        target.to(device)
        n, bad = check_lossless(target, draft, prompts, args.gammas, args.cache_ratios, args.policy,
                                args.max_new_tokens, device, progress=bar.update, batch_sizes=args.batch_sizes)
    combos = (f"{len(prompts)} prompts x batch sizes {args.batch_sizes} x gammas {args.gammas} x cache ratios "
              f"{args.cache_ratios}, {args.max_new_tokens} tokens each")
    if bad:
        for m in bad[:20]:
            print(f"MISMATCH prompt {m.prompt} batch {m.batch_size} gamma {m.gamma} cache ratio {m.cache_ratio}: first differs at "
                  f"token {m.position} (autoregressive {m.expected}, speculative {m.got})")
        print(f"FAIL: {len(bad)}/{n} runs differ ({combos})")
        return 1
    print(f"OK: greedy speculative output equals greedy autoregressive output token for token in all {n} sequences ({combos})")
    return 0
