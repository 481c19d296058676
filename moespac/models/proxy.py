"""The proxy pair: a small Qwen3-MoE target and a dense Qwen3 draft distilled from it, trained here on an
offline chat corpus (every benchmark prompt held out) for a fixed number of steps, so that the whole pipeline
runs on a laptop CPU and two builds of one config give the same weights on any machine. A locally trained
proxy, not Qwen3-30B-A3B: its numbers describe the proxy.

Steps: corpus -> byte-level BPE tokenizer -> ChatML token stream -> target (CE + router aux loss) ->
draft (KL to the target's logits mixed with CE) -> save_pretrained both + MODEL_CARD.md / model_card.json.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

import torch

from moespac.errors import MoespacError
from moespac.models import corpus as corpora
from moespac.models.proxy_config import CONFIGS, ProxyConfig, get_config  # noqa: F401 (re-exported)
from moespac.models.proxy_train import (DistillBatches, Windows, distill_loss, evaluate, init_from_target,
                                         popularity, routing_counts, target_continuations, target_loss, token_stream,
                                         train)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def active_params(model, cfg: ProxyConfig) -> int:
    """Parameters one token touches: all but the experts it is not routed to."""
    per_expert = 3 * cfg.hidden * cfg.moe_ffn
    return n_params(model) - cfg.layers * (cfg.experts - cfg.top_k) * per_expert


# ---- the build ----------------------------------------------------------------------------------------

def build_proxy(out: str | Path, cfg: ProxyConfig, *, seed: int = 0, corpus_path: str | None = None,
                force: bool = False, log=print) -> dict:
    """Train the pair for its fixed step counts and write DIR/target, DIR/draft and the model card; returns the
    card. A cfg.budget_minutes a user set only guards: a build that runs longer fails (OverBudget), writing nothing."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from moespac.models.proxy_card import write_card
    from moespac.models.tokenizer import train_tokenizer

    start = time.perf_counter()
    deadline = None if cfg.budget_minutes is None else start + 60 * cfg.budget_minutes
    out = Path(out)
    for sub in ("target", "draft"):
        if (out / sub).exists() and any((out / sub).iterdir()) and not force:
            raise MoespacError(f"{out / sub} exists and is not empty; pass --force to replace it")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    guard = "" if cfg.budget_minutes is None else f" of {cfg.budget_minutes:g} min"
    torch.manual_seed(seed)
    try:
        holdout, n_prompts = corpora.benchmark_holdout()
        convs, stats = corpora.collect(cfg.corpus, cfg.corpus_chars, holdout, path=corpus_path)
        stats.benchmark_prompts = n_prompts
        log(f"corpus: {stats.kept} conversations, {stats.chars / 1e6:.1f}M chars from {cfg.corpus} "
            f"({stats.held_out} dropped as containing a benchmark prompt, {stats.non_english} non-English)")
        texts, n = [], 0
        for m in (m for c in convs for m in c):
            if n >= cfg.tokenizer_chars:
                break
            texts.append(m["content"])
            n += len(m["content"])
        tokenizer = train_tokenizer(texts, cfg.vocab_size)
        vocab = len(tokenizer)
        ids = token_stream(convs, tokenizer)
        n_val = cfg.seq_len * cfg.val_windows + 1
        if len(ids) < 4 * n_val:
            raise MoespacError(f"corpus gives only {len(ids)} tokens; raise corpus_chars ({cfg.corpus_chars})")
        train_data = Windows(ids[:-n_val], cfg.seq_len, cfg.batch_size, seed)
        val_batches = Windows(ids[-n_val:], cfg.seq_len, cfg.batch_size, seed).fixed(cfg.val_windows)
        prep_s = time.perf_counter() - start
        log(f"tokenizer: vocab {vocab}, {len(ids) / 1e6:.2f}M tokens ({prep_s:.0f}s so far)")

        target = AutoModelForCausalLM.from_config(cfg.target_config(vocab))
        log(f"target: Qwen3-MoE {n_params(target) / 1e6:.2f}M params, {cfg.layers} layers x {cfg.experts} experts "
            f"top-{cfg.top_k}; training {cfg.target_steps} steps on {cfg.threads} thread(s)")
        target_log = train(target, target_loss, train_data, steps=cfg.target_steps, lr=cfg.lr, warmup=cfg.warmup_steps,
                           weight_decay=cfg.weight_decay, label="target", deadline=deadline, budget_note=guard, log=log)
        target.requires_grad_(False)
        target.config.output_router_logits = False  # training only; also the inference default of Qwen3-MoE releases

        t0 = time.perf_counter()
        held = 8 if cfg.onpolicy_prompts else 0
        rows, mask = target_continuations(target, tokenizer, convs, count=cfg.onpolicy_prompts + held,
                                          new_tokens=cfg.onpolicy_tokens, width=cfg.seq_len, seed=seed)
        continuations = (rows[len(rows) - held:], mask[len(rows) - held:])
        rows, mask = rows[:len(rows) - held], mask[:len(rows) - held]
        gen_s = time.perf_counter() - t0
        log(f"target continuations for the draft: {len(rows)} (+{held} held back) x {cfg.onpolicy_tokens} tokens "
            f"in {gen_s:.0f}s")
        torch.manual_seed(seed + 1)
        draft = AutoModelForCausalLM.from_config(cfg.draft_config(vocab))
        if cfg.draft_from_target:
            init_from_target(draft, target)
        log(f"draft: dense Qwen3 {n_params(draft) / 1e6:.2f}M params, {cfg.draft_layers} layers; distilling "
            f"{cfg.draft_steps} steps")
        draft_data = DistillBatches(train_data, rows, mask, cfg.onpolicy_share, seed + 2)
        draft_log = train(draft, distill_loss(target, cfg.distill_ce_weight), draft_data, steps=cfg.draft_steps,
                          lr=cfg.draft_lr, warmup=cfg.warmup_steps, weight_decay=cfg.weight_decay, label="draft",
                          deadline=deadline, budget_note=guard, log=log)
        draft_log["continuations_s"] = round(gen_s, 1)

        val = evaluate(target, draft, val_batches, cfg.distill_ce_weight, continuations)
        routing = popularity(routing_counts(target, val_batches))
        log(f"held-back: target CE {val['target_ce']:.3f}  aux {val['target_aux']:.3f}  "
            f"draft KL {val['draft_kl']:.3f}  draft/target top-1 agreement {val['draft_agree']:.3f} "
            f"(on target continuations {val.get('draft_agree_on_target_continuations', float('nan')):.3f})  "
            f"top-10% expert share {routing['top10_share_mean']:.3f}")

        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            for sub, model in (("target", target), ("draft", draft)):
                d = out / sub
                if d.exists():
                    shutil.rmtree(d)
                d.mkdir(parents=True)
                model.generation_config.eos_token_id = [im_end, tokenizer.eos_token_id]
                model.generation_config.pad_token_id = tokenizer.pad_token_id
                model.save_pretrained(d)
                tokenizer.save_pretrained(d)
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        card = dict(
            config=dataclasses.asdict(cfg), seed=seed, threads=cfg.threads, load_average_at_start=load,
            corpus=dataclasses.asdict(stats), tokens=dict(train=len(ids) - n_val, held_back=n_val, vocab=vocab),
            target=dict(params=n_params(target), active_params=active_params(target, cfg), **target_log),
            draft=dict(params=n_params(draft), **draft_log), held_back=val, routing=routing,
            preparation_s=round(prep_s, 1), wall_s=round(time.perf_counter() - start, 1))
        write_card(out, card)
        log(f"wrote {out}/target, {out}/draft and {out}/MODEL_CARD.md in {card['wall_s']:.0f}s" +
            (f" (guard {60 * cfg.budget_minutes:.0f}s)" if cfg.budget_minutes is not None else ""))
        return card
    finally:
        torch.set_num_threads(prev_threads)
