"""Load a target and a draft by hub id or local folder (safetensors), with one-line errors."""

from __future__ import annotations

import os
import socket
import warnings
from pathlib import Path
from urllib.parse import urlparse

import torch

from moespac.errors import MoespacError

DTYPES = {"auto": "auto", "fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16, "fp64": torch.float64}


def check_ref(ref: str, role: str) -> bool:
    """True for a local folder; a path-like reference that does not exist fails naming it."""
    if Path(ref).expanduser().exists():
        return True
    if ref.startswith((".", "/", "~")) or os.sep in ref.strip("/").replace("/", "", 1):
        raise MoespacError(f"{role} {ref!r}: no such folder")
    return False


def not_on_hub(ref: str, role: str) -> MoespacError:
    return MoespacError(
        f"{role} {ref!r}: not a local folder and it could not be fetched from the Hugging Face hub "
        f"(offline or unknown id). Download it where you are online (hf download {ref} --local-dir DIR) "
        f"and pass DIR, or build a local pair with `moespac make-micro --out DIR` / `moespac build-proxy --out DIR`.")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (its endpoint from $HF_ENDPOINT), within `timeout`."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((host.hostname, host.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _cached_on_disk(ref: str) -> bool:
    """Whether the hub cache already holds this id's config (then loading works offline)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(ref, "config.json"), str) or \
            isinstance(try_to_load_from_cache(ref, "tokenizer_config.json"), str)
    except Exception:  # an id the cache cannot even name (malformed)
        return False


def hub_unavailable(ref: str) -> bool:
    """A hub id that neither the local hub cache holds nor the hub can serve now: fail at once, not after the
    hub client's retries (~30 s)."""
    return not _cached_on_disk(ref) and not hub_reachable()


def _from_pretrained(cls, ref: str, role: str, **kw):
    is_local = check_ref(ref, role)
    if not is_local and hub_unavailable(ref):
        raise not_on_hub(ref, role)
    try:
        with warnings.catch_warnings():  # torch warns about the protocol of a pickle it is about to refuse
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return cls.from_pretrained(str(Path(ref).expanduser()) if is_local else ref, local_files_only=is_local,
                                       **kw)
    except OSError as e:
        if is_local:
            raise MoespacError(f"{role} {ref!r}: not a loadable model folder ({_first_line(e)})") from None
        raise not_on_hub(ref, role) from None
    except Exception as e:
        # truncated or corrupt weights (safetensors' header errors), a pickle that torch's weights_only refuses
        if is_local and (isinstance(e, (ValueError, RuntimeError, EOFError)) or "Safetensor" in type(e).__name__
                         or "Unpickl" in type(e).__name__):
            raise MoespacError(f"{role} {ref!r}: its files cannot be read ({type(e).__name__}: "
                               f"{_first_line(e)})") from None
        raise


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0].strip()[:300] if lines else type(e).__name__


def load_model(ref: str, role: str = "model", dtype: str = "auto", device: str = "cpu",
               trust_remote_code: bool = False):
    """Load a causal LM from a local folder or a hub id; returns the model in eval mode."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise MoespacError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    model = _from_pretrained(AutoModelForCausalLM, ref, role, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code)
    return model.to(device).eval()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def load_tokenizer(ref: str, role: str = "tokenizer", trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    folder = Path(ref).expanduser()
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise MoespacError(f"{role} {ref!r}: the folder has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    return _from_pretrained(AutoTokenizer, ref, role, trust_remote_code=trust_remote_code)


def vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def check_pair(target, draft, target_ref: str = "target", draft_ref: str = "draft") -> None:
    """The draft must share the target's vocabulary (speculative decoding compares token ids)."""
    from moespac.models.experts import find_experts

    if not find_experts(target):
        raise MoespacError(f"target {target_ref!r} is not an MoE model: no routed experts found "
                           f"({type(target).__name__}); pass an MoE model such as Qwen3-MoE, DeepSeek-V2 or Mixtral")
    if draft is not None and vocab_size(draft) != vocab_size(target):
        raise MoespacError(f"draft {draft_ref!r} vocabulary ({vocab_size(draft)}) differs from target {target_ref!r} "
                           f"({vocab_size(target)}): speculative decoding needs a shared vocabulary")


def load_pair(target_ref: str, draft_ref: str | None, dtype: str = "auto", device: str = "cpu",
              trust_remote_code: bool = False):
    """Load (target, draft or None, tokenizer) and check they fit together."""
    target = load_model(target_ref, "target", dtype, device, trust_remote_code)
    draft = load_model(draft_ref, "draft", dtype, device, trust_remote_code) if draft_ref else None
    tokenizer = load_tokenizer(target_ref, "target tokenizer", trust_remote_code)
    check_pair(target, draft, target_ref, draft_ref or "")
    return target, draft, tokenizer
