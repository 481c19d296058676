"""`moespac make-micro`: write a small random target + draft pair for tests and smoke runs."""

from pathlib import Path

from moespac.errors import MoespacError
from moespac.models.micro import ARCHS  # torch-free at import: the CLI starts without torch


def register(sub) -> None:
    p = sub.add_parser("make-micro", help="write a small random MoE target + dense draft (shared tokenizer)")
    p.add_argument("--out", required=True, help="output folder (target/ and draft/ are written inside)")
    p.add_argument("--arch", default="qwen3_moe", choices=ARCHS, help="target architecture")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    from moespac.models.micro import make_micro

    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise MoespacError(f"--out {args.out}: is a file; give a folder (the pair goes to OUT/target and OUT/draft)")
    out = make_micro(args.out, args.arch, args.seed)
    print(f"wrote {out}/target and {out}/draft ({args.arch}, random weights)")
    return 0
