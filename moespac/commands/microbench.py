"""`moespac microbench scheduler`: the MoE-SpAc scheduler's overhead on this machine vs the paper's."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("microbench", help="time components on this machine (timing: measured)",
                       description=__doc__)
    p.add_argument("target", choices=["scheduler"], help="what to time")
    p.add_argument("--alpha", type=float, default=0.8,
                   help="draft acceptance rate; sets the verify steps of a 512-token generation")
    p.add_argument("--repeats", type=int, default=5, help="best of this many runs")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic activation counts")
    p.set_defaults(func=run)


def run(args) -> int:
    from moespac.errors import MoespacError
    from moespac.experiments.overhead import PAPER, measure

    if not 0 <= args.alpha < 1 or args.repeats < 1:
        raise MoespacError("--alpha must lie in [0, 1) and --repeats be >= 1")
    m = measure(alpha=args.alpha, repeats=args.repeats, seed=args.seed)
    L, E, k = m["shape"]
    print(f"MoE-SpAc scheduler overhead, Qwen3-30B-A3B shape ({L} layers x {E} experts, top-{k}), "
          f"gamma={m['gamma']}, compiled loops (numba) on this machine")
    print(f"synthetic trace with temporal locality: 512 tokens in {m['steps']} verify steps "
          f"(expected 512 / Omega = {512 / m['omega']:.0f} at alpha={m['alpha']})")
    rows = [
        ("estimator update, all layers in one call (update_at=step)", f"{m['estimator_ms_per_step']:.4f} ms/step",
         f"{PAPER['estimator_ms_per_step']} ms/step"),
        ("estimator update, 48 per-layer calls (update_at=layer, default)",
         f"{m['estimator_per_layer_calls_ms_per_step']:.4f} ms/step", f"{PAPER['estimator_ms_per_step']} ms/step"),
        ("tau selection, summed over the generation", f"{m['tau_ms_per_generation']:.3f} ms",
         f"{PAPER['tau_ms_per_generation']} ms"),
        ("r_c/r_g coefficient update (the warm-up arithmetic, as the paper times it)",
         f"{m['coef_ns_per_layer']:.2f} ns/layer", f"{PAPER['coef_ns_per_layer']} ns/layer"),
        ("  one Python call per step (what the policy runs)", f"{m['coef_call_ns_per_layer']:.1f} ns/layer",
         "not reported"),
        ("  with collecting the step's shares (our whole observe)", f"{m['observe_ns_per_layer']:.1f} ns/layer",
         "not reported"),
        ("estimator state size", f"{m['state_kb']:.1f} KiB ({m['state_bytes']} B)", f"~{PAPER['state_kb']:.0f} KB"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, ours, paper in rows:
        print(f"  {name:<{width}}  {ours:>24}   paper {paper:<14} timing: measured")
    return 0
