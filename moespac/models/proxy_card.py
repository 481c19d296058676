"""The proxy pair's model card: MODEL_CARD.md for people, model_card.json (same facts) for tools."""

from __future__ import annotations

import os
import time
from pathlib import Path

from moespac.atomic import write_json, write_text
from moespac.environment import environment

DISCLAIMER = ("A locally trained proxy, not Qwen3-30B-A3B (nor any released model): numbers measured on it "
              "describe this proxy only.")
HOLDOUT_RULE = ("a conversation is dropped if any message equals a benchmark prompt (or a paragraph of one) "
                "after normalisation (lower case, alphanumeric words), or contains the first 8 normalised words "
                "of a benchmark prompt or of any of its paragraphs of 8+ words")


def write_card(out: Path, card: dict) -> None:
    card = dict(card, title=f"moespac proxy pair ({card['config']['name']})", disclaimer=DISCLAIMER,
                holdout_rule=HOLDOUT_RULE, timing="measured",
                created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                machine=dict(environment(), cpu_count=os.cpu_count()))
    write_json(out / "model_card.json", card)
    write_text(out / "MODEL_CARD.md", render(card))


def render(c: dict) -> str:
    cfg, corpus, tgt, dft, val, rt = c["config"], c["corpus"], c["target"], c["draft"], c["held_back"], c["routing"]
    m = c["machine"]
    load = (f", load average {c['load_average_at_start']:.1f} at start"
            if c.get("load_average_at_start") is not None else "")
    guard = f" within a {60 * cfg['budget_minutes']:.0f} s guard" if cfg.get('budget_minutes') is not None else ""
    lines = [
        f"# {c['title']}", "",
        f"**{DISCLAIMER}**", "",
        "`target/`: Qwen3-MoE architecture (`Qwen3MoeForCausalLM`); `draft/`: dense Qwen3 (`Qwen3ForCausalLM`) "
        "distilled from the target. Both load with `AutoModelForCausalLM.from_pretrained(DIR/target)` "
        "(safetensors) and share one tokenizer (ChatML chat template).", "",
        "## Training data", "",
        f"- source: `{corpus['source']}` ({corpus['path']})",
        f"- conversations read {corpus['read']}, kept {corpus['kept']} "
        f"({corpus['chars']:,} characters of message text), cut at 16k characters: {corpus['truncated']}",
        f"- **held out: {corpus['held_out']} conversations dropped because they contain an evaluation prompt** "
        f"(checked against all {corpus['benchmark_prompts']} offline prompts of the seven benchmarks; "
        f"rule: {HOLDOUT_RULE})",
        f"- non-English (under 90 % ASCII) dropped: {corpus['non_english']}",
        f"- format: each conversation rendered with the ChatML chat template, joined by `<|endoftext|>`; "
        f"{c['tokens']['train']:,} training tokens, {c['tokens']['held_back']:,} held back for the final losses",
        f"- tokenizer: byte-level BPE trained here with `tokenizers` on {cfg['tokenizer_chars']:,} characters, "
        f"vocabulary {c['tokens']['vocab']}", "",
        "## Models", "",
        "| | architecture | params | shape |", "|---|---|---|---|",
        f"| target | Qwen3-MoE | {tgt['params']:,} ({tgt['active_params']:,} active per token) | "
        f"{cfg['layers']} layers, "
        f"hidden {cfg['hidden']}, {cfg['heads']} heads ({cfg['kv_heads']} KV) x {cfg['head_dim']}, {cfg['experts']} "
        f"experts top-{cfg['top_k']}, expert FFN {cfg['moe_ffn']}, router load-balancing loss (per layer, averaged) "
        f"coefficient {cfg['aux_loss_coef']} |",
        f"| draft | dense Qwen3 | {dft['params']:,} | {cfg['draft_layers']} layers, hidden {cfg['draft_hidden']}, "
        f"FFN {cfg['draft_ffn']}"
        f"{', embeddings / output head initialised from the target' if cfg['draft_from_target'] else ''} |",
        "", "## Training (fixed step counts; the seconds are measured)", "",
        "| | steps | tokens | seconds | tokens/s | final training losses (smoothed) |", "|---|---|---|---|---|---|",
        f"| target | {tgt['steps']} | {tgt['tokens']:,} | {tgt['seconds']} | {tgt['tokens_per_s']} | "
        f"CE {tgt.get('train_ce', float('nan')):.3f}, router aux {tgt.get('train_aux', float('nan')):.3f} "
        f"(perfectly balanced routing gives {cfg['top_k']}) |",
        f"| draft | {dft['steps']} | {dft['tokens']:,} | {dft['seconds']} | {dft['tokens_per_s']} | "
        f"KL {dft.get('train_kl', float('nan')):.3f}, CE {dft.get('train_ce', float('nan')):.3f} |", "",
        f"AdamW (peak lr {cfg['lr']} target / {cfg['draft_lr']} draft, weight decay {cfg['weight_decay']}), "
        f"{cfg['warmup_steps']} warm-up steps, cosine decay over the fixed step count; batch {cfg['batch_size']} x "
        f"{cfg['seq_len']} tokens; fp32; draft loss = {1 - cfg['distill_ce_weight']:.2f} KL(target || draft) + "
        f"{cfg['distill_ce_weight']:.2f} CE; {cfg['onpolicy_share']:.0%} of the draft's batches are the target's own "
        f"greedy continuations ({cfg['onpolicy_tokens']} tokens) of {cfg['onpolicy_prompts']} first user turns of "
        f"training conversations (on-policy distillation; generated in {dft.get('continuations_s', 0)} s of "
        f"the draft's time).", "",
        "Held-back tokens: " + ", ".join(f"{k.replace('_', ' ')} {v:.3f}" for k, v in val.items()) +
        " (draft agree = share of positions where the draft's top token is the target's).", "",
        f"Expert popularity on the held-back tokens (uniform routing would give a top-10 % share of "
        f"{rt['top10_share_uniform']:.3f}): "
        f"top-10 % share {rt['top10_share_mean']:.3f} per layer on average (min {rt['top10_share_min']:.3f}, "
        f"max {rt['top10_share_max']:.3f}), busiest expert / mean load {rt['max_over_mean_load']:.2f}, "
        f"at most {rt['unused_experts_max']} unused experts in a layer.", "",
        "## Run", "",
        f"- wall time {c['wall_s']} s{guard} (preparation {c['preparation_s']} s); "
        f"seed {c['seed']}; torch threads {c['threads']}; the weights depend on the config, seed, data and software, "
        "not on the machine's speed",
        f"- machine: {m['platform']}, {m['cpu']}, {m['cpu_count']} CPUs{load}; python {m['python']}, "
        f"torch {m['packages'].get('torch')}, transformers {m['packages'].get('transformers')}, "
        f"tokenizers {m['packages'].get('tokenizers')}; git {m['git_commit']}",
        f"- created {c['created']} by `moespac build-proxy --config {cfg['name']}`; timings are wall-clock and "
        f"depend on how busy the machine was; the step counts do not", "",
    ]
    return "\n".join(lines)
