"""`moespac calibrate`: measure this machine into a hardware profile (YAML) for the simulator."""

from __future__ import annotations

import argparse
import os

from moespac.atomic import atomic_path
from moespac.commands._common import ints
from moespac.iopaths import IO


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine into a hardware profile for `moespac simulate`",
                       description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, metavar="PROFILE.yaml", help="profile to write (atomically)")
    p.add_argument("--name", default=None, help="profile name (default: calibrated-<hostname>)")
    p.add_argument("--hidden", type=int, default=2048,
                   help="expert input width to time; the default is Qwen3-30B-A3B's")
    p.add_argument("--expert-ffn", type=int, default=768, help="expert intermediate width to time")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="host expert dtype")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per point (median kept)")
    p.add_argument("--tokens", type=ints, default=None, metavar="N,N,...",
                   help="token counts of the expert-time sweep (default 1,2,4,...,512)")
    p.add_argument("--threads", type=int, default=None, help="host threads (default: torch's; set the engine's)")
    p.set_defaults(func=run, io=IO(outputs=("out",)))


def run(args: argparse.Namespace) -> int:
    from moespac.errors import MoespacError
    from moespac.bench.calibrate import CalibrationConfig, calibrate
    from moespac.sim.profile import load_profile, profile_yaml

    if args.hidden < 8 or args.expert_ffn < 8 or args.repeats < 1:
        raise MoespacError("--hidden and --expert-ffn must be >= 8 and --repeats >= 1")
    expert_gib = 3 * args.hidden * args.expert_ffn * 4 / 2**30  # gate, up, down in fp32 (the sweep's host dtype)
    host_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    if expert_gib > host_gib / 8:  # the timing cycles several experts through memory at once
        raise MoespacError(f"--hidden {args.hidden} x --expert-ffn {args.expert_ffn}: one expert is "
                           f"{expert_gib:.3g} GiB, more than an eighth of this machine's {host_gib:.0f} GiB")
    if args.tokens is not None and (not args.tokens or min(args.tokens) < 1):
        raise MoespacError(f"--tokens {args.tokens}: positive token counts")
    if args.threads is not None and args.threads < 1:
        raise MoespacError(f"--threads {args.threads} must be >= 1")
    cfg = CalibrationConfig(hidden=args.hidden, expert_ffn=args.expert_ffn, dtype=args.dtype, repeats=args.repeats,
                            **({"tokens": tuple(sorted(set(args.tokens)))} if args.tokens else {}))
    import torch

    before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        profile, measurements = calibrate(cfg, name=args.name)
    finally:
        torch.set_num_threads(before)
    with atomic_path(args.out) as tmp:
        tmp.write_text(profile_yaml(profile, measurements))
    written = load_profile(args.out)  # what simulate will read: validated
    print(f"wrote {args.out}: profile {written.name!r} (sha256 {written.sha256[:12]})"
          f"{' - CPU-only: device = host' if written.device_is_host else ''}")
    for key, unit in type(written).parameters().items():
        print(f"  {key:22s} {getattr(written, key):.4g} {unit}")
    return 0
