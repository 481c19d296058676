"""A causal LM over a batch with its KV cache, as speculative decoding needs it.

Sequences of a batch share the cache columns, and `valid[b, c]` says which belong to sequence b; rejected drafts
are cropped or masked out (an exact crop at batch 1). Layers with recurrent state roll back to a `checkpoint()`
(batch 1 only). `lean=True` runs a Llama-family decoder at batch 1 through moespac.engine.lean.

Details: docs/internals.md#moespacenginekvcachepy.
"""

from __future__ import annotations

import inspect

import torch

from moespac.engine.lean import lean_forward
from moespac.errors import MoespacError


def cache_keyword(model) -> str:
    """The name under which `model.forward` takes its KV cache."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _recurrent(layer) -> bool:
    return hasattr(layer, "recurrent_states") or hasattr(layer, "conv_states")


_STATE_KEYS = ("conv_states", "recurrent_states", "has_previous_state", "is_conv_states_initialized",
               "is_recurrent_states_initialized")


def _snapshot(layer) -> dict:
    """Copies of a recurrent layer's states (a tensor, or a dict of tensors in newer releases)."""
    def copy(v):
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, dict):
            return {k: copy(x) for k, x in v.items()}
        return v
    return {k: copy(getattr(layer, k)) for k in _STATE_KEYS if hasattr(layer, k)}


class CachedModel:
    """A causal LM over a batch, with its KV cache and a validity mask over cache columns."""

    def __init__(self, model, batch: int, lean: bool = False):
        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self.keyword = cache_keyword(model)
        params = inspect.signature(model.forward).parameters
        self.keeps_logits = "logits_to_keep" in params
        # a trained MoE may keep output_router_logits=True from training: the aux loss and the captured router
        # logits are wasted work at inference
        self.extra = {"output_router_logits": False} if "output_router_logits" in params else {}
        self.cache = None  # the model makes its own on the first forward (some need their own cache class)
        # at batch 1 a decoder the lean forward knows skips transformers' module Python (moespac.engine.lean)
        self.lean = lean_forward(model) if lean and batch == 1 else None
        self.valid = torch.zeros((batch, 0), dtype=torch.bool, device=self.device)
        self._checkpoint = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.valid.sum(1)

    @property
    def recurrent(self) -> bool:
        return any(_recurrent(layer) for layer in getattr(self.cache, "layers", None) or [])

    @torch.no_grad()
    def forward(self, pending: list[list[int]], last_only: bool = False) -> torch.Tensor:
        """Feed each sequence's pending tokens (left-padded to one width); logits [B, width, V] ([B, 1, V], the
        last column's, with `last_only`)."""
        if self.lean is not None:
            return self._lean_forward(pending[0], last_only)
        width = max(len(p) for p in pending)
        ids = torch.zeros((len(pending), width), dtype=torch.long)
        new_valid = torch.zeros((len(pending), width), dtype=torch.bool)
        for b, p in enumerate(pending):
            if p:
                ids[b, width - len(p):] = torch.tensor(p)
                new_valid[b, width - len(p):] = True
        ids, new_valid = ids.to(self.device), new_valid.to(self.device)
        pos = (self.lengths[:, None] + torch.cumsum(new_valid, 1) - 1).clamp_min(0)
        mask = torch.cat([self.valid, new_valid], 1)
        batched = len(pending) > 1 or not bool(mask.all())
        out = self.model(input_ids=ids, use_cache=True, position_ids=pos,
                         attention_mask=mask.long() if batched else None,
                         **({} if self.cache is None else {self.keyword: self.cache}), **self.extra,
                         **({"logits_to_keep": 1} if last_only and self.keeps_logits else {}))
        returned = out["cache"] if "cache" in out.keys() else out.get("past_key_values")
        if returned is None:
            raise MoespacError(f"{type(self.model).__name__}: the forward returned no KV cache")
        if self.cache is None:
            self.cache = returned
        elif returned is not self.cache:
            raise MoespacError(f"{type(self.model).__name__}: the model ignored {self.keyword}= and started a new KV "
                               "cache; this transformers release is not supported")
        self.valid = mask
        return out.logits

    def _lean_forward(self, pending: list[int], last_only: bool) -> torch.Tensor:
        """Batch 1 through the lean forward: no padding, no mask columns, positions continue the cache."""
        past = self.valid.shape[1]
        ids = torch.tensor([pending], dtype=torch.long, device=self.device)
        pos = torch.arange(past, past + len(pending), device=self.device)[None]
        if self.cache is None:
            self.cache = self.lean.new_cache()
        logits = self.lean(ids, pos, self.cache, last_only)
        self.valid = torch.ones((1, past + len(pending)), dtype=torch.bool, device=self.device)
        return logits

    def checkpoint(self) -> None:
        """Before a forward whose tokens may be partly rejected: copy what a crop cannot undo."""
        if self.cache is None:  # nothing yet: rolling back is starting over
            self._checkpoint = (self.valid.clone(), None)
            return
        if not self.recurrent:
            return
        if self.valid.shape[0] != 1:
            raise MoespacError("speculative decoding of a model with recurrent (linear-attention) state runs at "
                               "batch size 1 only")
        self._checkpoint = (self.valid.clone(), {i: _snapshot(layer) for i, layer in enumerate(self.cache.layers)
                                                 if _recurrent(layer)})

    def keep(self, lengths: list[int]) -> None:
        """Keep the first lengths[b] valid columns of each sequence; drop the rest."""
        checkpoint, self._checkpoint = self._checkpoint, None
        if checkpoint is not None and self.recurrent:
            valid, states = checkpoint
            if bool((self.lengths > torch.tensor(lengths, device=self.device)).any()):  # a token since is dropped
                if states is None:
                    self.cache = None
                else:
                    self._crop_attention(self.valid.shape[1] - valid.shape[1])
                    for i, saved in states.items():
                        for k, v in saved.items():
                            setattr(self.cache.layers[i], k, v)
                self.valid = valid
            return
        if self.recurrent and bool((self.lengths > torch.tensor(lengths, device=self.device)).any()):
            raise MoespacError("recurrent (linear-attention) state cannot be cropped without a checkpoint()")
        rank = torch.cumsum(self.valid, 1)
        self.valid &= rank <= torch.tensor(lengths, device=self.device)[:, None]
        used = torch.nonzero(self.valid.any(0))
        last = int(used.max()) + 1 if len(used) else 0
        if last < self.valid.shape[1]:
            self._crop_attention(self.valid.shape[1] - last)
            self.valid = self.valid[:, :last]
        if self.valid.shape[1] > 64 and self.valid.float().mean() < 0.5:
            self._compact()

    def _crop_attention(self, n: int) -> None:
        """Drop the last n columns of every attention layer (recurrent layers hold no columns)."""
        if n <= 0:
            return
        for layer in self.cache.layers:
            if not _recurrent(layer):
                layer.crop(-n)  # negative: a count of columns to drop, in every transformers 5 release
            elif getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[..., :-n, :], layer.values[..., :-n, :]

    def select(self, rows: list[int]) -> None:
        """Retire finished sequences: keep only `rows` of the batch."""
        idx = torch.tensor(rows, device=self.device)
        self.cache.batch_select_indices(idx)
        self.valid = self.valid[idx]

    def _compact(self) -> None:
        """Drop mask holes: move each sequence's valid columns to the right, left-padding the rest."""
        lengths = self.lengths
        width = int(lengths.max())
        B, T = self.valid.shape
        # target column of every valid entry: right-aligned by its rank among the sequence's valid columns
        dest = torch.cumsum(self.valid, 1) - 1 + (width - lengths)[:, None]
        src_b, src_c = torch.nonzero(self.valid, as_tuple=True)
        dst_c = dest[src_b, src_c]
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if t is None or t.numel() == 0:
                    continue
                new = t.new_zeros(t.shape[0], t.shape[1], width, t.shape[3])
                new[src_b, :, dst_c] = t[src_b, :, src_c]
                setattr(layer, name, new)
        valid = torch.zeros((B, width), dtype=torch.bool, device=self.device)
        valid[src_b, dst_c] = True
        self.valid = valid
