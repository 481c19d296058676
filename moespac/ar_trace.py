"""The autoregressive trace of a speculative run: the target's routing of every token the run kept.

Of a batch-1 verify step's rows, the first `emitted` are exactly the inputs an autoregressive run of the same
tokens feeds the target over the same context, so their routing is the AR routing up to float rounding
(`tests/test_ar_trace.py` measures it). The rejected drafts' rows are dropped, the prefill is kept as it is.
One recording thus gives both traces of a (benchmark, length) pair; the trace says so (meta 'derived').

Details: docs/internals.md#moespacar_tracepy.
"""

from __future__ import annotations

import numpy as np

from moespac.errors import MoespacError
from moespac.trace import KINDS, Trace, bench_trace_id

PREFILL, VERIFY, AR = (KINDS.index(k) for k in ("prefill", "verify", "ar"))
NOTE = ("derived from a speculative trace: each kept token's routing from the verify pass that ran it (rows "
        "0..emitted-1 of each verify step), one AR step per token; the rejected drafts' rows dropped")


def ar_from_speculative(sd: Trace, where: str = "trace") -> Trace:
    """The AR trace of the tokens `sd` (a batch-1 speculative trace recorded by `moespac bench`) kept."""
    m = sd.meta
    bench = m.get("bench")
    if not isinstance(bench, dict):
        raise MoespacError(f"{where}: not recorded by `moespac bench` (no per-request facts to derive from)")
    if int(m.get("batch_size", 1)) != 1:
        raise MoespacError(f"{where}: batch size {m.get('batch_size')}; an AR trace derives from batch 1 only "
                           "(a batched step records accepted drafts summed over its sequences, "
                           "not which rows each kept)")
    st = sd.steps
    kind, tokens, gamma, emitted = st["step_kind"], st["step_tokens"], st["step_gamma"], st["step_emitted"]
    if not (kind == VERIFY).any() or (kind == AR).any():
        raise MoespacError(f"{where}: not a speculative trace (it has {'AR' if (kind == AR).any() else 'no verify'} "
                           "steps); derive from one recorded with a draft")
    verify = kind == VERIFY
    if (tokens[verify] != gamma[verify].astype(np.int64) + 1).any() or (emitted[verify] > tokens[verify]).any():
        raise MoespacError(f"{where}: a verify step is not [kept token + gamma drafts] wide; "
                           "not a batch-1 engine trace")
    # rows kept per step: a prefill's all, a verify step's first `emitted`; each kept verify row is one AR step
    prefill = kind == PREFILL
    kept = np.where(prefill, tokens, emitted).astype(np.int64)
    first = np.cumsum(kept) - kept
    keep = np.repeat(sd.offsets()[:-1], kept) + np.arange(int(kept.sum())) - np.repeat(first, kept)
    per_step = np.where(prefill, 1, kept)  # output steps per input step
    out_kind = np.where(prefill, PREFILL, AR)
    steps = dict(step_request=np.repeat(st["step_request"], per_step), step_kind=np.repeat(out_kind, per_step),
                 step_tokens=np.repeat(np.where(prefill, tokens, 1), per_step),
                 step_gamma=np.zeros(int(per_step.sum())), step_accepted=np.zeros(int(per_step.sum())),
                 step_emitted=np.repeat(np.where(prefill, emitted, 1), per_step))
    steps = {n: a.astype(st[n].dtype) for n, a in steps.items()}
    config = dict(bench["config"], gamma=0, draft_id=None, derived_from=sd.trace_id())
    facts = dict(bench, config=config,
                 rows=[dict(r, steps=r["new_tokens"] - 1, drafted=0, accepted=0, rejected=0) for r in bench["rows"]])
    meta = dict(m)
    meta.update(gamma=0, draft=None, bench=facts, derived=NOTE, derived_from=sd.trace_id(),
                trace_id=bench_trace_id(config))
    out = Trace(meta=meta, steps=steps, topk_ids=sd.topk_ids[keep], topk_weights=sd.topk_weights[keep],
                cross_topk=None if sd.cross_topk is None else sd.cross_topk[keep])
    return out.validate(f"{where} (derived AR)")
