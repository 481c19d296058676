"""Run llama.cpp's convert_hf_to_gguf.py with the BPE pre-tokenizer type stated instead of detected.

Usage: python _convert_gguf.py LLAMA_CPP_DIR PRE_TOKENIZER_OR_EMPTY CONVERTER_ARGS...

The converter recognises a BPE pre-tokenizer by hashing the ids of a fixed test string, so any newly
trained vocabulary is refused. Naming the type (e.g. 'gpt-2' for a byte-level BPE with the GPT-2 regex)
replaces that lookup; everything else is the converter as shipped. Runs in its own process so the
vendored gguf-py never meets the caller's imports.
"""

import runpy
import sys
from pathlib import Path

llama_dir, pre_tokenizer, converter_args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
sys.path[:0] = [str(llama_dir), str(llama_dir / "gguf-py")]
if pre_tokenizer:
    from conversion.base import TextModel

    TextModel.get_vocab_base_pre = lambda self, tokenizer: pre_tokenizer
converter = llama_dir / "convert_hf_to_gguf.py"
sys.argv = [str(converter), *converter_args]
runpy.run_path(str(converter), run_name="__main__")
