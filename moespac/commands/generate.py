"""`moespac generate`: one prompt through the real engine; prints text and speed, writes record and trace."""

from __future__ import annotations

from moespac.commands._common import add_engine_args, add_model_args, check_engine_args, finite
from moespac.errors import MoespacError
from moespac.iopaths import IO


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate with speculative decoding over the hybrid expert engine")
    add_model_args(p)
    add_engine_args(p)
    p.add_argument("--prompt", required=True,
                   help="prompt text (the chat template is applied if the tokenizer has one)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--greedy", action="store_true", help="greedy decoding (default: sample at --temperature)")
    p.add_argument("--temperature", type=finite, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the result record here")
    p.add_argument("--trace", default=None, help="write the activation trace (.npz) here")
    p.set_defaults(func=run, io=IO(outputs=("json", "trace"), inputs=("target", "draft")))


def encode_prompt(tokenizer, text: str, raw: bool = False) -> list[int]:
    from moespac.datasets import encode_messages

    return list(tokenizer.encode(text)) if raw else encode_messages(tokenizer, [{"role": "user", "content": text}])


def run(args) -> int:
    from moespac.bench.record_files import write_result
    from moespac.engine.session import EngineSession, config_from_args
    from moespac.engine.speculative import Sampling
    from moespac.models.specs import spec_from_config
    from moespac.record import make_record

    check_engine_args(args)
    if args.max_new_tokens < 1:
        raise MoespacError(f"--max-new-tokens {args.max_new_tokens} must be >= 1")
    if args.temperature < 0:
        raise MoespacError(f"--temperature {args.temperature} must be >= 0 (0 = greedy)")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # undecodable bytes in argv arrive as lone surrogates
        raise MoespacError(f"--prompt is not valid UTF-8 (at character {e.start})") from None
    sampling = Sampling(temperature=0.0 if args.greedy else args.temperature, seed=args.seed)
    gamma = args.gamma if args.draft else 0
    cfg = config_from_args(args, gamma=gamma, context=args.max_new_tokens + 2048)
    with EngineSession.open(cfg) as session:
        tok = session.tokenizer
        spec = spec_from_config(session.target.config, name=args.target)
        if args.trace:
            session.record(spec.to_dict(), meta=dict(target=args.target, draft=args.draft, gamma=gamma, batch_size=1,
                                                     policy=args.policy,
                                                     cache_ratio=session.runtime.cache.capacity
                                                     / max(session.topology.num_layers
                                                           * session.topology.num_experts, 1)))
        prompt = encode_prompt(tok, args.prompt, args.raw)
        (res,), stats = session.generate([prompt], gamma=gamma, max_new_tokens=args.max_new_tokens, sampling=sampling)
        trace = session.finish_trace(trace_id=f"generate-{args.policy}-{args.seed}") if args.trace else None
        device = str(session.runtime.device.torch_device)
        plan = session.plan
    print(tok.decode(res.tokens, skip_special_tokens=True))
    print("---")
    print(f"tokens/s {res.tokens_per_second:.2f} (measured, decode)   new tokens {len(res.tokens)}   "
          f"prefill {res.prefill_s:.3f}s   decode {res.decode_s:.3f}s")
    if gamma:
        print(f"acceptance rate {res.acceptance_rate:.3f} ({res.accepted}/{res.drafted} drafts, gamma {args.gamma})")
    print(f"cache hit rate {stats['hit_rate']:.3f}   hits {stats['hits']}   on-demand loads {stats['loads']}   "
          f"host-computed experts {stats['host']}   prefetched {stats['prefetched']}   "
          f"bytes copied {stats['bytes_copied']}   slots {stats['capacity']} ({plan.requested})   "
          f"policy {stats['policy']}")
    tau = stats["policy_stats"].get("tau_per_layer_mean")
    if tau is not None:
        print("tau per layer " + " ".join(f"{t:.2f}" if isinstance(t, float) else str(t) for t in tau))
    if trace is not None:
        trace.save(args.trace)
        print(f"trace: {args.trace} ({trace.num_steps} steps)")
    if args.json:
        config = dict(target=args.target, draft=args.draft, policy=args.policy, gamma=args.gamma,
                      cache_ratio=args.cache_ratio, cache_gib=args.cache_gib, slots=stats["capacity"],
                      per_layer=args.per_layer, copy_mode=args.copy_mode, max_new_tokens=args.max_new_tokens,
                      sampling=sampling.__dict__, device=device, dtype=args.dtype, prompt=args.prompt, raw=args.raw)
        write_result(args.json, make_record("generate", "measured", config, dict(res.summary(), **stats),
                                            model_spec=spec.to_dict(), trace=args.trace))
        print(f"record: {args.json}")
    return 0
