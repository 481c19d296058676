"""`moespac import-trace`: per-token expert routing from a serving stack (SGLang, a vLLM/HF hook) -> a trace."""

from __future__ import annotations

import argparse

from moespac.commands._common import finite
from moespac.iopaths import IO


def register(sub) -> None:
    p = sub.add_parser("import-trace", help="turn SGLang's returned routed experts (or our plain JSONL) into a trace",
                       description=__doc__.splitlines()[0],
                       epilog="Formats and the step rule: docs/internals.md (moespac/import_trace.py); "
                              "the workflow: README, 'Bring your own routing'.")
    p.add_argument("file", metavar="FILE", help="JSONL: SGLang responses, one per line, or our plain records")
    p.add_argument("--format", required=True, choices=["sglang", "jsonl"],
                   help="sglang: /generate responses with meta_info.routed_experts; "
                        "jsonl: one record per (request, token)")
    p.add_argument("--out", required=True, help="trace file to write (.npz)")
    p.add_argument("--gamma", type=int, default=8, help="drafted tokens per verify step; 0 = autoregressive steps")
    p.add_argument("--acceptance", type=finite, default=None,
                   help="accepted / drafted tokens, in [0, 1] (default: SGLang's spec_accept_rate in the responses)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--model-spec", default=None,
                   help="registry name or model folder: topology, expert sizes and the spec stored in the trace")
    g.add_argument("--num-experts", type=int, default=None,
                   help="experts per MoE layer, when no spec is named (simulate then needs --model-spec)")
    p.add_argument("--top-k", type=int, default=None,
                   help="experts per token, for --format sglang without --model-spec (its array is flat)")
    p.add_argument("--limit", type=int, default=None, help="the file's first N requests (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="each request's first N new tokens (default: all it has)")
    p.add_argument("--benchmark", default=None,
                   help="the prompts' benchmark: the trace then replays through `moespac bench --timing simulated`"
                        " (the pipeline's cells), not only `moespac simulate`")
    p.add_argument("--model", default=None,
                   help="the model that routed, as records and tables name it (default: the --model-spec name)")
    p.add_argument("--json", default=None, metavar="RECORD", help="write a small import record here")
    p.set_defaults(func=run, io=IO(outputs=("out", "json"), inputs=("file",), positional=("file",)))


def run(args: argparse.Namespace) -> int:
    from moespac.atomic import write_json
    from moespac.import_trace import import_trace
    from moespac.sim.simulate import spec_named

    spec = spec_named(args.model_spec) if args.model_spec else None
    trace, summary = import_trace(args.file, args.format, args.gamma, args.acceptance, spec, args.num_experts,
                                  args.top_k, limit=args.limit, max_new_tokens=args.max_new_tokens,
                                  benchmark=args.benchmark, model=args.model)
    trace.save(args.out)
    if args.json:
        write_json(args.json, dict(kind="import-trace", out=args.out, **summary))
    t, s = summary["topology"], summary["steps"]
    acc = "" if not args.gamma else f", acceptance {summary['acceptance']} ({summary['acceptance_source']})"
    print(f"imported {len(summary['requests'])} requests ({summary['prompt_tokens']} prompt + "
          f"{summary['decoded_tokens']} decoded tokens; {t['num_layers']} MoE layers x {t['num_experts']} experts, "
          f"top-{t['top_k']}) -> {args.out}")
    print(f"  steps: {s['prefill']} prefill, {s['verify']} verify (gamma {args.gamma}), {s['ar']} AR{acc}; "
          f"weights {summary['weights']}")
    if args.gamma:
        print(f"  note: {summary['structure']}")
    if spec is None:
        print("  no model spec stored: `moespac simulate` needs --model-spec NAME")
    return 0
