"""Training pieces of the proxy pair: token windows, the target's own continuations, losses, the fixed-step
training loop (with a wall-clock guard), and held-back evaluation (losses, draft agreement, expert popularity)."""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from moespac.errors import MoespacError
from moespac.routing import top_share


# ---- data --------------------------------------------------------------------------------------------

class Windows:
    """Random (training) or evenly spaced (evaluation) windows of a token stream."""

    def __init__(self, ids: torch.Tensor, seq_len: int, batch_size: int, seed: int):
        if len(ids) <= seq_len:
            raise MoespacError(f"token stream of {len(ids)} tokens is shorter than seq_len {seq_len}: read more corpus")
        self.ids, self.seq_len, self.batch_size = ids, seq_len, batch_size
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self) -> torch.Tensor:
        starts = torch.randint(0, len(self.ids) - self.seq_len, (self.batch_size,), generator=self.gen)
        return torch.stack([self.ids[s:s + self.seq_len] for s in starts.tolist()])

    def fixed(self, count: int) -> list[torch.Tensor]:
        starts = torch.linspace(0, len(self.ids) - self.seq_len, count).long().unique().tolist()
        rows = [self.ids[s:s + self.seq_len] for s in starts]
        return [torch.stack(rows[i:i + self.batch_size]) for i in range(0, len(rows), self.batch_size)]


def token_stream(conversations, tokenizer) -> torch.Tensor:
    """ChatML-formatted conversations (the tokenizer's chat template), separated by <|endoftext|>."""
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in conversations]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return torch.tensor([t for seq in ids for t in (*seq, eos)], dtype=torch.long)


def target_continuations(target, tokenizer, conversations, *, count: int, new_tokens: int, width: int, seed: int,
                         batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's greedy continuations of `count` first user turns of training conversations (ChatML, with the
    generation prompt): the token paths greedy speculative decoding verifies, so distilling on them teaches the
    draft the target's own behaviour (on-policy distillation). Returns right-padded rows [n, width] and their mask."""
    firsts = [c[:1] for c in conversations if c[0]["role"] == "user"]
    order = torch.randperm(len(firsts), generator=torch.Generator().manual_seed(seed))[:count].tolist()
    prompts = [list(tokenizer.apply_chat_template(firsts[i], add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))[-(width - new_tokens):] for i in order]
    pad = tokenizer.pad_token_id
    rows, mask = torch.full((len(prompts), width), pad), torch.zeros((len(prompts), width))
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        n = max(map(len, chunk))
        ids = torch.tensor([[pad] * (n - len(p)) + p for p in chunk])  # left padding for generation
        att = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            out = target.generate(input_ids=ids, attention_mask=att, max_new_tokens=new_tokens, do_sample=False,
                                  pad_token_id=pad)
        for j, p in enumerate(chunk):
            seq = p + out[j, n:].tolist()
            rows[i + j, :len(seq)] = torch.tensor(seq)
            mask[i + j, :len(seq)] = 1
    return rows, mask


class DistillBatches:
    """Draft batches (tokens, mask): corpus windows, or with probability `share` rows of target continuations."""

    def __init__(self, windows: Windows, rows: torch.Tensor, mask: torch.Tensor, share: float, seed: int):
        self.windows, self.rows, self.mask, self.share = windows, rows, mask, share if len(rows) else 0.0
        self.batch_size, self.seq_len = windows.batch_size, windows.seq_len
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self):
        if torch.rand((), generator=self.gen) < self.share:
            idx = torch.randint(0, len(self.rows), (self.batch_size,), generator=self.gen)
            return self.rows[idx], self.mask[idx]
        return self.windows.batch(), None


# ---- training ----------------------------------------------------------------------------------------

def layer_balance_loss(router_logits, top_k: int) -> torch.Tensor:
    """Switch-Transformer load-balancing loss of each MoE layer, averaged over layers (balanced routing gives
    top_k). transformers' own aux loss pools the counts of all layers, so one layer can collapse onto a few
    experts while the pooled counts stay balanced: seen at 48 layers x 128 experts (82 of a layer's 128 unused)."""
    losses = []
    for logits in router_logits:
        probs = logits.float().softmax(-1)
        chosen = torch.zeros_like(probs).scatter_(-1, probs.topk(top_k, -1).indices, 1.0)
        losses.append(probs.shape[-1] * (chosen.mean(0) * probs.mean(0)).sum())
    return torch.stack(losses).mean()


def target_loss(model, x: torch.Tensor):
    """Next-token CE + router_aux_loss_coef * per-layer load-balancing loss. Runs the base model and the head
    itself: the causal-LM wrapper would also compute transformers' pooled aux loss, which nothing here reads (a
    softmax and top-k per layer, ~15 % of a 12 x 256 training step; same weights to the bit, measured)."""
    out = model.model(input_ids=x, output_router_logits=True)
    logits = model.lm_head(out.last_hidden_state)
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
    aux = layer_balance_loss(out.router_logits, model.config.num_experts_per_tok)
    return ce + model.config.router_aux_loss_coef * aux, {"ce": ce.item(), "aux": aux.item()}


def _mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return values.mean() if mask is None else (values * mask).sum() / mask.sum().clamp(min=1)


def distill_loss(target, ce_weight: float):
    """Draft loss on a (tokens, mask or None) batch: (1 - w) KL(target || draft) per token + w CE; also reports
    top-1 agreement. Masked positions (right padding) do not count."""
    def loss(draft, batch):
        x, mask = batch
        with torch.no_grad():
            t = target(input_ids=x, output_router_logits=False).logits.float().log_softmax(-1)
        logits = draft(input_ids=x).logits.float()
        logq = logits.log_softmax(-1)
        kl = _mean((t.exp() * (t - logq)).sum(-1), mask)
        ce = _mean(F.cross_entropy(logits[:, :-1].transpose(1, 2), x[:, 1:], reduction="none"),
                   None if mask is None else mask[:, 1:])
        agree = _mean((logits.argmax(-1) == t.argmax(-1)).float(), mask)
        return (1 - ce_weight) * kl + ce_weight * ce, {"kl": kl.item(), "ce": ce.item(), "agree": agree.item()}
    return loss


class OverBudget(MoespacError):
    """A build ran past its wall-clock guard (the step counts, not the clock, end training)."""


def train(model, loss_fn, data, *, steps: int, lr: float, warmup: int, weight_decay: float, label: str,
          deadline: float | None = None, budget_note: str = "", log=print, log_every_s: float = 30.0) -> dict:
    """AdamW with linear warm-up and cosine decay to 10 % over exactly `steps` steps. `deadline`
    (time.perf_counter() value) is a guard: passing it raises OverBudget naming the step reached; it never
    shortens training, so the weights depend on the seed and the data alone."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    model.train()
    start = last_log = time.perf_counter()
    ema = {}
    for step in range(steps):
        if deadline is not None and time.perf_counter() > deadline:
            raise OverBudget(f"proxy build over its wall-clock guard{budget_note} at {label} step {step} of {steps} "
                             f"({time.perf_counter() - start:.0f}s into {label} training): raise --budget-minutes; "
                             "the step counts, not the guard, decide the weights")
        scale = min(1.0, (step + 1) / max(1, warmup)) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        loss, metrics = loss_fn(model, data.batch())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for k, v in metrics.items():  # smoothed training metrics (the last steps' average, roughly)
            ema[k] = v if k not in ema else 0.95 * ema[k] + 0.05 * v
        if time.perf_counter() - last_log >= log_every_s:
            last_log = time.perf_counter()
            shown = "  ".join(f"{k} {v:.3f}" for k, v in ema.items())
            rate = (step + 1) / (last_log - start)
            log(f"  {label} step {step + 1}/{steps}  {shown}  lr {lr * scale:.2e}  "
                f"{(step + 1) * data.batch_size * data.seq_len / (last_log - start):.0f} tok/s  "
                f"~{(steps - step - 1) / rate:.0f}s left")
    model.eval()
    seconds_run = time.perf_counter() - start
    return dict(steps=steps, seconds=round(seconds_run, 1), tokens=steps * data.batch_size * data.seq_len,
                tokens_per_s=round(steps * data.batch_size * data.seq_len / max(seconds_run, 1e-9), 1),
                **{f"train_{k}": round(v, 4) for k, v in ema.items()})


def init_from_target(draft, target) -> None:
    """Start the draft from the target's token embeddings, final norm and output head (same width): the draft
    then only has to learn its layers. (Copying the target's first attention layers as well did not help.)"""
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.model.norm.weight.copy_(target.model.norm.weight)
        draft.lm_head.weight.copy_(target.lm_head.weight)


# ---- evaluation ---------------------------------------------------------------------------------------

def routing_counts(model, batches) -> torch.Tensor:
    """Routing entries per expert [L, E] over `batches` (top-k of each layer's router)."""
    counts = None
    with torch.no_grad():
        for x in batches:
            logits = model(input_ids=x, output_router_logits=True).router_logits
            k = model.config.num_experts_per_tok
            c = torch.stack([torch.bincount(torch.topk(l, k, -1).indices.flatten(), minlength=l.shape[-1])
                             for l in logits])
            counts = c if counts is None else counts + c
    return counts


def popularity(counts: torch.Tensor) -> dict:
    """How skewed expert use is per layer: top-10 % share (and its uniform value), busiest / mean, unused experts."""
    counts = counts.numpy()
    share = top_share(counts)
    return dict(top10_share_mean=round(float(share.mean()), 4), top10_share_min=round(float(share.min()), 4),
                top10_share_max=round(float(share.max()), 4),
                top10_share_uniform=round(math.ceil(0.1 * counts.shape[-1]) / counts.shape[-1], 4),
                unused_experts_max=int((counts == 0).sum(-1).max()),
                max_over_mean_load=round(float((counts.max(-1) / counts.mean(-1)).mean()), 3))


def evaluate(target, draft, batches, ce_weight: float, continuations=None) -> dict:
    """Held-back losses: target CE and aux, draft KL / CE / top-1 agreement with the target on corpus windows,
    and the draft's agreement on held-back target continuations (what greedy acceptance depends on)."""
    tot = {}
    with torch.no_grad():
        for x in batches:
            _, m = target_loss(target, x)
            _, d = distill_loss(target, ce_weight)(draft, (x, None))
            for k, v in [*(("target_" + k, v) for k, v in m.items()), *(("draft_" + k, v) for k, v in d.items())]:
                tot[k] = tot.get(k, 0.0) + v / len(batches)
        if continuations is not None and len(continuations[0]):
            tot["draft_agree_on_target_continuations"] = (
                distill_loss(target, ce_weight)(draft, continuations)[1]["agree"])
    return {k: round(v, 4) for k, v in tot.items()}
