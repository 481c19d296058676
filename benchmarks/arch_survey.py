"""Every MoE architecture transformers dispatches through its ExpertsInterface, tried in the engine.

For each model type whose modelling code decorates an experts class with `use_experts_implementation`,
the class's default config is shrunk to a tiny random model (float64) and greedy speculative decoding over
the hybrid engine (lru, half the experts on the device, gamma 4) is compared with transformers' own greedy
generate(). Each architecture ends as: lossless, mismatch, refused (the engine's one-line reason), or
not built (no tiny model could be made from its config by shrinking the usual fields; not checked).

    python benchmarks/arch_survey.py [--only qwen3_moe,olmoe] [--markdown out.md]

The nine architectures of the lossless tests (tests/test_engine_lossless.py) are checked there in full;
this survey is the wider, shallower look that the README's architecture list comes from.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import signal
import warnings

import torch

SMALL = dict(hidden_size=64, intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=320,
             num_experts=8, n_routed_experts=8, num_local_experts=8, num_experts_per_tok=2, moe_topk=2,
             first_k_dense_replace=0, max_position_embeddings=512, n_group=1, topk_group=1, kv_lora_rank=16,
             q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, linear_num_key_heads=2,
             linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, sliding_window=64,
             num_nextn_predict_layers=0, mlp_only_layers=[], decoder_sparse_step=1, moe_layer_freq=1,
             tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def experts_model_types() -> list[str]:
    import transformers

    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    out = []
    for f in sorted(glob.glob(os.path.join(root, "*", "modeling_*.py"))):
        if "@use_experts_implementation" in open(f).read():
            out.append(os.path.basename(os.path.dirname(f)))
    return out


def tiny(model_type: str):
    """The architecture's default config, shrunk: the usual size fields, and per-layer lists cut to one layer
    of each kind (so a model whose first layers are dense keeps an MoE layer)."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    layers = getattr(text, "num_hidden_layers", None)
    per_layer = {k: v for k, v in vars(text).items() if isinstance(v, list) and layers and len(v) == layers}
    small = dict(SMALL)
    if vars(text).get("kv_lora_rank"):  # MLA: full-width KV heads, and the rotary part is the checked head_dim
        small.update(head_dim=SMALL["qk_rope_head_dim"], q_lora_rank=32, num_key_value_heads=4)
    for key, value in small.items():
        if key in vars(text) or hasattr(type(text), key):
            try:
                setattr(text, key, value)
            except Exception:  # noqa: BLE001 - read-only or per-layer attributes keep their defaults
                pass
    for key, values in per_layer.items():
        kinds = list(dict.fromkeys(map(str, values)))
        kept = [next(v for v in values if str(v) == k) for k in kinds][:4]
        try:
            setattr(text, key, kept)
            text.num_hidden_layers = len(kept)
        except Exception:  # noqa: BLE001
            pass
    return cfg, text


class Timeout(Exception):
    pass


def survey(model_type: str) -> tuple[str, str]:
    from transformers import AutoModelForCausalLM

    from moespac.engine.hybrid import HybridRuntime, RuntimeConfig
    from moespac.engine.speculative import generate
    from moespac.errors import MoespacError
    from moespac.lossless import hf_greedy
    from moespac.registry import make_policy

    model, error = None, None
    try:
        configs = tiny(model_type)
    except Exception as e:  # noqa: BLE001
        return "not built", f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
    for config in configs:  # the whole config, else its text part (vision-language models)
        try:
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
            break
        except Exception as e:  # noqa: BLE001 - a survey: every failure is a row
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:90]}" if str(e) else type(e).__name__
    if model is None:
        return "not built", error
    prompt = [5, 17, 42, 9, 33, 21]
    try:
        expected = hf_greedy(model, [prompt], 8)[0]
    except Exception as e:  # noqa: BLE001
        return "not built", f"HF generate: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
    try:
        rt = HybridRuntime(model, make_policy("lru"), RuntimeConfig(cache_ratio=0.5))
    except MoespacError as e:
        if "no routed experts" in str(e):  # the shrinking kept only dense layers
            return "not built", "no MoE layer left after shrinking"
        return "refused", str(e)[:120]
    try:
        rt.start_request(gamma=4, signals={"draft"})
        got = generate(model, prompt, draft=model, gamma=4, max_new_tokens=8, runtime=rt, ignore_eos=True).tokens
    except MoespacError as e:
        return "refused", str(e)[:120]
    except Exception as e:  # noqa: BLE001
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
    finally:
        rt.close()
    return ("lossless", "") if got == expected else ("mismatch", f"{expected} vs {got}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="comma-separated model types")
    ap.add_argument("--markdown", default=None, help="also write the table here")
    ap.add_argument("--seconds", type=int, default=60, help="give up on one architecture after this long")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    torch.set_num_threads(1)
    types = args.only.split(",") if args.only else experts_model_types()

    def alarm(*_):
        raise Timeout()

    signal.signal(signal.SIGALRM, alarm)
    rows = []
    for mt in types:
        signal.alarm(args.seconds)
        try:
            status, why = survey(mt)
        except Timeout:
            status, why = "not built", f"over {args.seconds} s"
        finally:
            signal.alarm(0)
        rows.append((mt, status, why))
        print(f"{mt:<26} {status:<10} {why}", flush=True)
    counts = {s: sum(r[1] == s for r in rows) for s in ("lossless", "mismatch", "refused", "error", "not built")}
    print("; ".join(f"{k}: {v}" for k, v in counts.items()))
    if args.markdown:
        from moespac.atomic import write_text

        lines = ["| architecture | result | note |", "|---|---|---|"]
        lines += [f"| {mt} | {status} | {re.sub(r'[|]', '/', why)} |" for mt, status, why in rows]
        write_text(args.markdown, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
