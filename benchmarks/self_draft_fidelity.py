"""How well MoE-SpeQ's lookahead (the target's routing with INT4 experts over the drafted tokens, signal
'self_draft_topk') foresees the routing of the verify step it precedes, on a trace recorded with it:

    moespac bench --model-pair results/models/proxy-shape --benchmark humaneval --policy all-host --cache-ratio 0 \
        --gamma 8 --max-new-tokens 512 --limit 5 --seed 0 --ignore-eos --temperature 0.8 --warmup 0 \
        --self-draft-lookahead --trace T.npz --out T.json
    python benchmarks/self_draft_fidelity.py T.npz

It prints (1) the share of a token's top-k that the self-draft names for the same token and layer, over the
rows it covers (the last verify row has no drafted token before it); (2) per verify step and layer, the share of
the experts the step routes that are in the lookahead buffer, beside the same share for the previous step's
experts (the stand-in the policy falls back to with elb=previous).
"""

from __future__ import annotations

import argparse

import numpy as np

from moespac.trace import load_trace


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a trace recorded with --self-draft-lookahead")
    args = p.parse_args()
    t = load_trace(args.trace)
    if t.self_draft_topk is None:
        raise SystemExit(f"self_draft_fidelity: {args.trace} has no self_draft_topk "
                         "(record it with --self-draft-lookahead)")
    agree = rows = 0
    cover_elb, cover_prev, previous = [], [], None
    for s in range(t.num_steps):
        ids, elb = t.step_ids(s).astype(np.int64), t.step_self_draft(s).astype(np.int64)  # [T, L, k]
        if t.kind(s) == "verify":
            covered = (elb >= 0).all(axis=2)  # [T, L]
            for tok, layer in zip(*np.nonzero(covered)):
                agree += len(np.intersect1d(ids[tok, layer], elb[tok, layer]))
                rows += 1
            for layer in range(ids.shape[1]):
                need = np.unique(ids[:, layer])
                cover_elb.append(np.isin(need, elb[:, layer]).mean())
                if previous is not None:
                    cover_prev.append(np.isin(need, previous[layer]).mean())
        previous = [np.unique(ids[:, layer]) for layer in range(ids.shape[1])]
    k = t.topology.top_k
    print(f"{args.trace}: {t.num_steps} steps, {t.topology.num_layers} MoE layers x {t.topology.num_experts} experts, "
          f"top-{k}")
    print(f"top-k agreement, self-draft vs target, same token and layer: {agree / max(rows * k, 1):.3f} "
          f"over {rows} rows")
    print(f"share of a verify step's experts in the lookahead buffer: self-draft {np.mean(cover_elb):.3f}, "
          f"previous step's experts {np.mean(cover_prev):.3f} (over {len(cover_elb)} step-layers)")


if __name__ == "__main__":
    main()
