"""baselines/programs: output parsers on captured llama.cpp output, command lines, build stamps, converter
wrapper, skip records. Nothing here builds or runs llama.cpp (the samples below were captured from a real run)."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from baselines.programs import SYSTEMS, _common, llamacpp, llamacpp_build, llamacpp_convert, moespac_release, vllm
from baselines.programs import accelerate as wrapped_accelerate
from moespac.errors import MoespacError

# Real output (stderr) of the proxy pair (resources/proxy/default, f32 GGUF) on prompt gsm8k/637, one thread,
# captured from this project's own runs of the commands in the comment above each sample.

# llama-completion -m target-f32.gguf -f PROMPT --no-escape -n 128 -c 2048 --temp 0.0 --seed 0 -t 1 -no-cnv --cpu-moe
COMPLETION = """\
0.00.001.006 I llama_completion: llama backend init
0.00.006.433 I llama_completion: load the model and apply lora adapter, if any
0.00.031.856 W llama_model_loader: tensor overrides to CPU are used with mmap enabled - consider using --load-mode \
none for better performance
0.00.044.159 I cmn          init: llama threadpool init, n_threads = 1
0.00.050.148 I 
0.00.050.228 I system_info: n_threads = 1 (n_threads_batch = 1) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 \
| F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | \
OPENMP = 1 | REPACK = 1 | 
0.00.050.229 I 
0.00.050.393 I sampler seed: 0
0.00.050.403 I sampler params: 
\trepeat_last_n = 64, repeat_penalty = 1.000, frequency_penalty = 0.000, presence_penalty = 0.000
\tdry_multiplier = 0.000, dry_base = 1.750, dry_allowed_length = 2, dry_penalty_last_n = 64
\ttop_k = 40, top_p = 0.950, min_p = 0.050, xtc_probability = 0.000, xtc_threshold = 0.100, typical_p = 1.000, \
top_n_sigma = -1.000, temp = 0.000
\tmirostat = 0, mirostat_lr = 0.100, mirostat_ent = 5.000, adaptive_target = -1.000, adaptive_decay = 0.900
0.00.050.407 I sampler chain: logits -> ?penalties -> ?dry -> ?top-n-sigma -> top-k -> ?typical -> top-p -> min-p -> \
?xtc -> temp-ext -> dist 
0.00.050.407 I generate: n_ctx = 2048, n_batch = 2048, n_predict = 128, n_keep = 0
0.00.050.408 I 
0.00.145.659 I common_perf_print:    sampling time =       1.05 ms
0.00.145.700 I common_perf_print:    samplers time =       0.67 ms /   201 tokens
0.00.145.735 I common_perf_print:        load time =      20.06 ms
0.00.149.712 I common_perf_print: prompt eval time =       8.75 ms /    73 tokens (    0.12 ms per token,  8347.63 \
tokens per second)
0.00.149.749 I common_perf_print:        eval time =      50.08 ms /   127 runs   (    0.39 ms per token,  2535.89 \
tokens per second)
0.00.149.782 I common_perf_print:       total time =      95.59 ms /   200 tokens
0.00.149.815 I common_perf_print: unaccounted time =      35.71 ms /  37.4 %      (total - sampling - prompt eval - \
eval) / (total)
0.00.149.849 I common_perf_print:    graphs reused =        126
"""

# llama-speculative-simple ... -md draft-f32.gguf --spec-type draft-simple --spec-draft-n-max 8 --spec-draft-p-min 0
#   --cpu-moe
SPECULATIVE_SIMPLE = """\
0.00.063.755 W llama_model_loader: tensor overrides to CPU are used with mmap enabled - consider using --load-mode \
none for better performance
0.00.075.422 I cmn          init: llama threadpool init, n_threads = 1
0.00.076.554 I common_speculative_init_result: loading draft model \
'/work/main/resources/llamacpp/gguf/default-1da05c23/draft-f32.gguf'
0.00.353.880 I encoded   73 tokens in    0.007 seconds, speed: 10944.527 t/s
0.00.353.918 I decoded  137 tokens in    0.252 seconds, speed:  544.353 t/s
0.00.353.984 I 
0.00.354.017 I n_draft   = 8
0.00.354.049 I n_predict = 137
0.00.354.113 I n_drafted = 267
0.00.354.146 I n_accept  = 103
0.00.354.178 I accept    = 38.577%
0.00.354.210 I 
0.00.354.242 I draft:

0.00.354.309 I 
0.00.354.342 I target:

0.00.354.375 I common_perf_print:    sampling time =       5.29 ms
0.00.354.408 I common_perf_print:    samplers time =       0.68 ms /   137 tokens
0.00.354.441 I common_perf_print:        load time =      20.44 ms
0.00.354.473 I common_perf_print: prompt eval time =     168.93 ms /   375 tokens (    0.45 ms per token,  2219.89 \
tokens per second)
0.00.354.506 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf \
tokens per second)
0.00.354.539 I common_perf_print:       total time =     277.95 ms /   376 tokens
0.00.354.571 I common_perf_print: unaccounted time =     103.73 ms /  37.3 %      (total - sampling - prompt eval - \
eval) / (total)
0.00.354.604 I common_perf_print:    graphs reused =         32
"""

# llama-speculative (same arguments)
SPECULATIVE = """\
0.00.048.294 W llama_model_loader: tensor overrides to CPU are used with mmap enabled - consider using --load-mode \
none for better performance
0.00.056.104 I cmn          init: llama threadpool init, n_threads = 1
0.00.099.396 I cmn          init: llama threadpool init, n_threads = 1
0.00.400.859 I encoded   73 tokens in    0.011 seconds, speed: 6533.608 t/s
0.00.400.860 I decoded  133 tokens in    0.283 seconds, speed:  470.487 t/s
0.00.400.860 I 
0.00.400.861 I n_draft   = 8
0.00.400.861 I n_predict = 133
0.00.400.861 I n_drafted = 264
0.00.400.861 I n_accept  = 99
0.00.400.862 I accept    = 37.500%
0.00.400.862 I 
0.00.400.862 I draft:

0.00.400.866 I 
0.00.400.866 I target:

0.00.400.867 I common_perf_print:    sampling time =       1.34 ms
0.00.400.867 I common_perf_print:    samplers time =       0.80 ms /   133 tokens
0.00.400.868 I common_perf_print:        load time =      16.57 ms
0.00.400.869 I common_perf_print: prompt eval time =     168.48 ms /   370 tokens (    0.46 ms per token,  2196.12 \
tokens per second)
0.00.400.869 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf \
tokens per second)
0.00.400.870 I common_perf_print:       total time =     343.64 ms /   371 tokens
0.00.400.870 I common_perf_print: unaccounted time =     173.82 ms /  50.6 %      (total - sampling - prompt eval - \
eval) / (total)
0.00.400.870 I common_perf_print:    graphs reused =         32
"""


# ---- parsers on the captured output

def test_parse_speculative_simple_sample():
    r = llamacpp.parse_speculative_output(SPECULATIVE_SIMPLE)
    assert (r["prompt_tokens"], r["new_tokens"], r["draft_max"], r["drafted"], r["accepted"]) == (73, 137, 8, 267, 103)
    assert r["acceptance_rate"] == 103 / 267
    assert (r["prefill_s"], r["decode_s"], r["decode_tokens_per_s"]) == (0.007, 0.252, 544.353)
    assert r["latency_s"] == 0.007 + 0.252


def test_parse_speculative_sample():
    r = llamacpp.parse_speculative_output(SPECULATIVE)
    assert (r["prompt_tokens"], r["new_tokens"], r["draft_max"], r["drafted"], r["accepted"]) == (73, 133, 8, 264, 99)
    assert (r["prefill_s"], r["decode_s"], r["decode_tokens_per_s"]) == (0.011, 0.283, 470.487)


def test_parse_completion_sample():
    r = llamacpp.parse_completion_output(COMPLETION)
    # -n 128: the first token comes from the prompt pass, the other 127 from 'runs'
    assert (r["prompt_tokens"], r["decode_runs"], r["new_tokens"]) == (73, 127, 128)
    assert ((r["prefill_s"], r["decode_s"], r["decode_tokens_per_s"], r["sampling_s"])
            == (8.75 / 1e3, 50.08 / 1e3, 2535.89, 1.05 / 1e3))


def test_parsers_reject_output_without_summary():
    # llama.cpp's logger thread is not flushed at exit: a successful run can lose its summary lines
    truncated = SPECULATIVE_SIMPLE[:SPECULATIVE_SIMPLE.index("encoded")]
    with pytest.raises(MoespacError, match="'encoded'"):
        llamacpp.parse_speculative_output(truncated)
    with pytest.raises(MoespacError, match="eval time"):
        llamacpp.parse_completion_output(COMPLETION.replace("eval time", "evaluation"))


def test_execute_repeats_a_run_that_lost_its_summary(monkeypatch):
    outputs = iter([SPECULATIVE_SIMPLE[:SPECULATIVE_SIMPLE.index("encoded")], SPECULATIVE_SIMPLE])
    monkeypatch.setattr(llamacpp.subprocess, "run",
                        lambda cmd, **k: subprocess.CompletedProcess(cmd, 0, "", next(outputs)))
    r = llamacpp.execute(["llama-speculative-simple"], speculative=True)
    assert r["attempts"] == 2 and r["accepted"] == 103 and r["command"] == ["llama-speculative-simple"]
    monkeypatch.setattr(llamacpp.subprocess, "run", lambda cmd, **k: subprocess.CompletedProcess(cmd, 1, "", "boom\n"))
    with pytest.raises(MoespacError, match="exit 1"):
        llamacpp.execute(["llama-completion"], speculative=False)


def test_parse_speculative_no_drafts_gives_no_rate():
    text = ("encoded    5 tokens in    0.100 seconds, speed:   50.000 t/s\n"
            "decoded    1 tokens in    0.010 seconds, speed:  100.000 t/s\n"
            "n_draft   = 8\nn_predict = 1\nn_drafted = 0\nn_accept  = 0\naccept    = nan%\n")
    r = llamacpp.parse_speculative_output(text)
    assert r["drafted"] == 0 and r["acceptance_rate"] is None and r["decode_tokens_per_s"] == 100.0


def test_parse_token_ids():
    assert llamacpp_convert.parse_token_ids("load stuff\n[12, 7, 301]\n") == [12, 7, 301]
    assert llamacpp_convert.parse_token_ids("[]\n") == []
    with pytest.raises(MoespacError):
        llamacpp_convert.parse_token_ids("no ids here")


# ---- command lines

def test_command_line_plain_and_speculative():
    cfg = llamacpp.RunConfig(n_predict=64, draft_max=6, threads=3, ctx_size=1024, seed=5)
    plain = llamacpp.command_line("/b", "t.gguf", "p.txt", cfg)
    assert plain == ["/b/llama-completion", "-m", "t.gguf", "-f", "p.txt", "--no-escape", "-n", "64", "-c", "1024",
                     "--temp", "0.0", "--seed", "5", "-t", "3", "-no-cnv", "--cpu-moe"]
    spec = llamacpp.command_line("/b", "t.gguf", "p.txt", cfg, draft_gguf="d.gguf")
    assert spec[0] == "/b/llama-speculative-simple"
    assert spec[spec.index("-md") + 1] == "d.gguf" and spec[spec.index("--spec-draft-n-max") + 1] == "6"
    assert spec[spec.index("--spec-draft-p-min") + 1] == "0" and "-no-cnv" not in spec
    assert spec[spec.index("--spec-type") + 1] == "draft-simple"
    gpu = llamacpp.command_line("/b", "t.gguf", "p.txt", llamacpp.RunConfig(cpu_moe=False, ignore_eos=True,
                                spec_tool="llama-speculative"), draft_gguf="d.gguf", cuda=True)
    assert gpu[0] == "/b/llama-speculative" and "--cpu-moe" not in gpu
    assert gpu[-5:] == ["-ngl", "all", "-ngld", "all", "--ignore-eos"]


@pytest.mark.parametrize("bad,key", [(dict(n_predict=0), "n_predict"), (dict(draft_max=0), "draft_max"),
                                     (dict(threads=0), "threads"), (dict(ctx_size=10, n_predict=10), "ctx_size"),
                                     (dict(temperature=-1.0), "temperature"), (dict(spec_tool="x"), "spec_tool")])
def test_run_config_validation_names_the_key(bad, key):
    with pytest.raises(MoespacError, match=key):
        llamacpp.RunConfig(**bad)


def test_release_command_line_follows_its_readme():
    args = Namespace(max_new_tokens=512, max_context=4096, seed=8, draft_max=8, threads=4, temperature=0.0,
                     ignore_eos=False)
    cmd = moespac_release.command_line("/r/bin", "t.gguf", "d.gguf", "p.txt", args)
    assert cmd[0] == "/r/bin/llama-speculative"
    assert cmd[cmd.index("-ot") + 1] == r"\.ffn_(up|down|gate)_exps=CPU"
    assert cmd[cmd.index("--draft") + 1] == "8" and cmd[cmd.index("-n") + 1] == "512"
    assert cmd[cmd.index("--temp") + 1] == "0.0" and "--ignore-eos" not in cmd
    cmd = moespac_release.command_line("/r/bin", "t.gguf", "d.gguf", "p.txt",
                                       Namespace(**dict(vars(args), temperature=0.8, ignore_eos=True)))
    assert cmd[cmd.index("--temp") + 1] == "0.8" and cmd[-1] == "--ignore-eos" and cmd[cmd.index("-s") + 1] == "8"


def test_prompt_file_survives_llamacpp_dropping_one_newline(tmp_path):
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    path = llamacpp_convert.prompt_file(text, tmp_path)
    content = path.read_text(encoding="utf-8")
    assert content == text + "\n"
    assert content[:-1] == text  # what `-f` leaves after popping one trailing newline


# ---- build stamp

def _fake_checkout(tmp_path: Path) -> Path:
    src = tmp_path / "llama.cpp"
    src.mkdir()
    (src / "CMakeLists.txt").write_text("project(x)\n")
    (src / "convert_hf_to_gguf.py").write_text("")
    return src


def _finished_build(out: Path, wanted: dict, tools=None) -> None:
    (out / "build" / "bin").mkdir(parents=True)
    for t in tools if tools is not None else wanted["targets"]:
        (out / "build" / "bin" / t).write_text("")
    (out / llamacpp_build.STAMP).write_text(json.dumps(dict(wanted, llama_commit="version: 1 (abc)")))


def test_up_to_date_needs_same_stamp_and_every_tool(tmp_path):
    wanted = llamacpp_build.wanted_stamp("sdist-sha256:aa", "llama-cpp-python==0.3.36", False,
                                         ["llama-tokenize", "llama-bench"])
    assert not llamacpp_build.up_to_date(tmp_path, wanted)  # nothing built
    _finished_build(tmp_path, wanted)
    assert llamacpp_build.up_to_date(tmp_path, wanted)
    assert not llamacpp_build.up_to_date(tmp_path, dict(wanted, source="sdist-sha256:bb"))
    assert not llamacpp_build.up_to_date(tmp_path, llamacpp_build.wanted_stamp(
        "sdist-sha256:aa", "llama-cpp-python==0.3.36", True, ["llama-tokenize", "llama-bench"]))  # CUDA flags differ
    (tmp_path / "build" / "bin" / "llama-bench").unlink()
    assert not llamacpp_build.up_to_date(tmp_path, wanted)


def test_build_skips_when_stamp_matches_and_rebuilds_otherwise(tmp_path, monkeypatch):
    src = _fake_checkout(tmp_path)
    out = tmp_path / "out"
    targets = ("llama-tokenize",)
    _, source = llamacpp_build.checkout_source(src)
    _finished_build(out, llamacpp_build.wanted_stamp(source, "checkout", False, targets))
    calls = []
    monkeypatch.setattr(llamacpp_build, "run_logged", lambda cmd, *a, **k: calls.append(cmd))
    b = llamacpp_build.build(src_dir=src, out=out, cuda="off", targets=targets)
    assert (calls == [] and b.llama_commit == "version: 1 (abc)"
            and b.tool("llama-tokenize") == str(out / "build/bin/llama-tokenize"))
    assert not b.cuda and "-DGGML_CUDA=ON" not in b.flags and b.version == "checkout"
    assert b.cpu_only_reason == "CUDA build turned off (--cuda off)"
    assert b.patches == () and (src / "CMakeLists.txt").read_text() == "project(x)\n"  # a user's tree: unchanged
    # another target set: configure + build run, and the stamp is rewritten
    monkeypatch.setattr(llamacpp_build, "tool_version", lambda binary: "version: 2 (def)")

    def fake_cmake(cmd, *a, **k):
        calls.append(cmd)
        if "--build" in map(str, cmd):
            (out / "build" / "bin" / "llama-bench").write_text("")

    monkeypatch.setattr(llamacpp_build, "run_logged", fake_cmake)
    b = llamacpp_build.build(src_dir=src, out=out, cuda="off", targets=targets + ("llama-bench",))
    assert [str(c[1]) for c in calls] == ["-S", "--build"]
    assert b.llama_commit == "version: 2 (def)"
    assert json.loads((out / llamacpp_build.STAMP).read_text())["targets"] == ["llama-bench", "llama-tokenize"]


def _fake_tools(llama: Path, body: str) -> None:
    for rel in llamacpp_build.FLUSHED_TOOLS:
        (llama / rel).parent.mkdir(parents=True, exist_ok=True)
        (llama / rel).write_text(body)


def test_flush_log_at_exit_flushes_before_mains_final_return(tmp_path):
    body = ('int helper() {\n    return 0;\n}\n\nint main() {\n    if (x) {\n        return 1;\n    }\n'
            '    LOG_INF("decoded %d tokens");\n    LOG("\\n\\n");\n\n    return 0;\n}\n')
    _fake_tools(tmp_path, body)
    name = llamacpp_build.flush_log_at_exit(tmp_path)
    want = body.replace('\n\n    return 0;\n}\n', '\n\n' + llamacpp_build.FLUSH_LINE + '    return 0;\n}\n')
    for rel in llamacpp_build.FLUSHED_TOOLS:
        assert (tmp_path / rel).read_text() == want  # only main's last return, after its last LOG
    assert llamacpp_build.flush_log_at_exit(tmp_path) == name and name.startswith("flush-log-at-exit:")
    assert all((tmp_path / rel).read_text() == want for rel in llamacpp_build.FLUSHED_TOOLS)  # applied once
    (tmp_path / llamacpp_build.FLUSHED_TOOLS[1]).write_text("int main() { return 0; }\n")
    with pytest.raises(MoespacError, match=r"speculative\.cpp: no final 'return 0;'"):
        llamacpp_build.flush_log_at_exit(tmp_path)


def test_sdist_build_is_patched_and_an_unpatched_build_is_redone(tmp_path, monkeypatch):
    llama = tmp_path / "src" / "vendor" / "llama.cpp"
    _fake_tools(llama, "int main() {\n    return 0;\n}\n")
    monkeypatch.delenv(llamacpp_build.SRC_ENV, raising=False)
    monkeypatch.setattr(llamacpp_build, "fetch_sdist", lambda root, version: tmp_path / "x.tar.gz")
    monkeypatch.setattr(llamacpp_build, "unpack_sdist", lambda tarball, root: (llama, "sdist-sha256:aa"))
    targets = ("llama-tokenize",)
    out = tmp_path / "out"
    _finished_build(out, llamacpp_build.wanted_stamp("sdist-sha256:aa", "llama-cpp-python==0.3.36", False, targets))
    calls = []
    monkeypatch.setattr(llamacpp_build, "run_logged", lambda cmd, *a, **k: calls.append(cmd))
    monkeypatch.setattr(llamacpp_build, "tool_version", lambda binary: "version: 2 (def)")
    b = llamacpp_build.build(out=out, cuda="off", targets=targets, root=tmp_path)
    assert [str(c[1]) for c in calls] == ["-S", "--build"]  # the stamp of an unpatched build does not match
    assert len(b.patches) == 1 and b.patches[0].startswith("flush-log-at-exit:")
    assert json.loads((out / llamacpp_build.STAMP).read_text())["patches"] == list(b.patches)
    assert llamacpp_build.FLUSH_LINE in (llama / llamacpp_build.FLUSHED_TOOLS[0]).read_text()
    calls.clear()
    assert llamacpp_build.build(out=out, cuda="off", targets=targets, root=tmp_path).patches == b.patches
    assert calls == []  # the patched build is reused


def test_build_env_var_names_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv(llamacpp_build.SRC_ENV, str(tmp_path / "missing"))
    with pytest.raises(MoespacError, match="not a llama.cpp tree"):
        llamacpp_build.build(cuda="off")


def test_cmake_flags_cuda_switch():
    assert "-DGGML_CUDA=ON" in llamacpp_build.cmake_flags(True)
    cpu = llamacpp_build.cmake_flags(False)
    assert "-DGGML_CUDA=ON" not in cpu and "-DLLAMA_CURL=OFF" in cpu and "-DLLAMA_BUILD_TESTS=OFF" in cpu
    with pytest.raises(MoespacError, match="--cuda"):
        llamacpp_build.resolve_cuda("maybe")


# ---- conversion

def _tokenizer_json(folder: Path, pre: dict | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps({"pre_tokenizer": pre}))
    return folder


def test_detect_pre_tokenizer(tmp_path):
    assert llamacpp_convert.detect_pre_tokenizer(
        _tokenizer_json(tmp_path / "a", {"type": "ByteLevel", "add_prefix_space": False})) == "gpt-2"
    assert llamacpp_convert.detect_pre_tokenizer(
        _tokenizer_json(tmp_path / "b", {"type": "ByteLevel", "use_regex": False})) is None
    split = {"type": "Sequence", "pretokenizers": [{"type": "Split"}, {"type": "ByteLevel", "use_regex": False}]}
    assert llamacpp_convert.detect_pre_tokenizer(_tokenizer_json(tmp_path / "c", split)) is None
    assert llamacpp_convert.detect_pre_tokenizer(tmp_path / "none") is None


def test_micro_tokenizer_is_gpt2_byte_level(tmp_path):
    from moespac.models.tokenizer import builtin_corpus, train_tokenizer

    train_tokenizer(builtin_corpus()[:50], 300).save_pretrained(tmp_path)
    assert llamacpp_convert.detect_pre_tokenizer(tmp_path) == "gpt-2"


def test_converter_wrapper_states_the_pre_tokenizer(tmp_path):
    """The wrapper replaces the converter's hash lookup and passes the converter its own arguments."""
    llama = tmp_path / "llama.cpp"
    (llama / "conversion").mkdir(parents=True)
    (llama / "gguf-py").mkdir()
    (llama / "conversion" / "__init__.py").write_text("")
    (llama / "conversion" / "base.py").write_text(
        "class TextModel:\n    def get_vocab_base_pre(self, tokenizer):\n"
        "        raise NotImplementedError('not recognized')\n")
    (llama / "convert_hf_to_gguf.py").write_text(
        "import sys\nfrom conversion.base import TextModel\n"
        "if __name__ == '__main__':\n    print(TextModel().get_vocab_base_pre(None), sys.argv[1:])\n")
    out = subprocess.run([sys.executable, str(llamacpp_convert.WRAPPER), str(llama), "gpt-2", "MODEL",
                          "--outtype", "f32"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "gpt-2 ['MODEL', '--outtype', 'f32']"
    res = subprocess.run([sys.executable, str(llamacpp_convert.WRAPPER), str(llama), "", "MODEL"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "not recognized" in res.stderr  # no type stated: the converter's own lookup


def test_convert_is_skipped_when_its_stamp_matches(tmp_path, monkeypatch):
    model = _tokenizer_json(tmp_path / "model", {"type": "ByteLevel"})
    (model / "config.json").write_text("{}")
    out = tmp_path / "g" / "target-f32.gguf"
    runs = []

    def fake_run(cmd, log, **k):
        runs.append(cmd)
        Path(cmd[cmd.index("--outfile") + 1]).write_text("gguf")

    monkeypatch.setattr(llamacpp_convert, "run_logged", fake_run)
    stamp = llamacpp_convert.convert(model, out, tmp_path, "f32", source_id="s1")
    assert stamp["pre_tokenizer"] == "gpt-2" and out.read_text() == "gguf" and len(runs) == 1
    assert runs[0][3] == "gpt-2"
    llamacpp_convert.convert(model, out, tmp_path, "f32", source_id="s1")
    assert len(runs) == 1
    (model / "config.json").write_text('{"changed": 1}')
    llamacpp_convert.convert(model, out, tmp_path, "f32", source_id="s1")
    assert len(runs) == 2
    with pytest.raises(MoespacError, match="outtype"):
        llamacpp_convert.convert(model, out, tmp_path, "q4_k")


# ---- prompts and records

def test_benchmark_prompt_text_gives_the_engine_ids():
    from moespac.models.tokenizer import builtin_corpus, train_tokenizer

    tok = train_tokenizer(builtin_corpus()[:80], 400)
    prompts, skipped = _common.benchmark_prompts(tok, "gsm8k", 3, 0, 2048, 16)
    assert len(prompts) == 3 and skipped == []
    for p in prompts:
        assert p.templated and p.text.startswith("<|im_start|>user\n") and p.text.endswith("<|im_start|>assistant\n")
        assert tok(p.text, add_special_tokens=False)["input_ids"] == p.ids
    cases = llamacpp_convert.tokenization_cases(tok, prompts)
    assert len(cases) == 3 + len(llamacpp_convert.CHECK_STRINGS) and cases[0][2] == prompts[0].ids
    everything, skipped = _common.benchmark_prompts(tok, "mt-bench", 10**6, 0, 4096, 16)  # the pipeline's "all"
    assert len(everything) + len(skipped) == 80


def test_summarize_totals_and_rates():
    reqs = [dict(new_tokens=10, decode_s=2.0, prefill_s=0.5, latency_s=2.5, decode_tokens_per_s=5.0,
                 drafted=16, accepted=8),
            dict(new_tokens=30, decode_s=2.0, prefill_s=0.25, latency_s=2.25, decode_tokens_per_s=15.0,
                 drafted=8, accepted=6)]
    m = _common.summarize(reqs)
    assert m["decode_tokens_per_s"] == 10.0 and m["decode_tokens_per_s_mean"] == 10.0
    assert m["new_tokens"] == 40 and m["prefill_s"] == 0.75 and m["latency_s_mean"] == 2.375
    assert (m["drafted"], m["accepted"], m["acceptance_rate"]) == (24, 14, 14 / 24)
    plain = [{k: v for k, v in r.items() if k not in ("drafted", "accepted")} for r in reqs]
    assert "acceptance_rate" not in _common.summarize(plain)


def _args(tmp_path, **kw):
    pair = tmp_path / "pair"
    for sub in ("target", "draft"):
        (pair / sub).mkdir(parents=True, exist_ok=True)
        (pair / sub / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_experts": 32}))
    common = dict(model_pair=str(pair), benchmark="gsm8k", limit=3, seed=0, max_new_tokens=16, max_context=2048,
                  temperature=0.0, ignore_eos=False, out=str(tmp_path / "r.json"))
    return Namespace(**dict(common, **kw))


def test_vllm_writes_a_skip_record_without_cuda(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm, "cuda_missing_reason", lambda: "no CUDA GPU visible to torch (test)")
    args = _args(tmp_path, cpu_offload_gb=None, draft=True, draft_max=8, gpu_memory_utilization=0.9)
    assert vllm.main(args) == 0
    rec = json.loads(Path(args.out).read_text())
    assert rec["timing"] == "wrapped" and rec["system"] == "vllm" and rec["skipped"] is True
    assert rec["skip_reason"] == "vLLM's CPU offload needs CUDA: no CUDA GPU visible to torch (test)"
    assert rec["metrics"] == {} and rec["config"]["speculative"] is True and len(rec["config_hash"]) == 12


def test_release_writes_a_skip_record_without_cuda_and_never_touches_the_network(tmp_path, monkeypatch):
    monkeypatch.setattr(moespac_release, "cuda_missing_reason", lambda: "no CUDA GPU visible to torch (test)")
    monkeypatch.setattr(moespac_release, "network_missing_reason", lambda *a: pytest.fail("network checked"))
    args = _args(tmp_path, commit=moespac_release.COMMIT, draft_max=8, threads=None)
    assert moespac_release.main(args) == 0
    rec = json.loads(Path(args.out).read_text())
    assert rec["system"] == "moe-spac-release" and rec["skipped"] is True and "CUDA build" in rec["skip_reason"]


def test_release_skips_without_network(monkeypatch):
    monkeypatch.setattr(moespac_release, "cuda_missing_reason", lambda: None)
    monkeypatch.setattr(moespac_release, "nvcc_missing_reason", lambda: None)
    monkeypatch.setattr(moespac_release, "network_missing_reason", lambda *a: "github.com is unreachable (test)")
    assert moespac_release.skip_reason() == "github.com is unreachable (test)"


def test_release_shape_read_from_its_source(tmp_path):
    f = tmp_path / "ggml" / "src" / "ggml-backend.cpp"
    f.parent.mkdir(parents=True)
    f.write_text("#include <x>\n#define NLAYERS 48\n#define  NEXPERTS   128\n")
    assert moespac_release.release_shape(tmp_path) == (48, 128)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_local_experts": 32}))
    assert moespac_release.model_shape(model) == (4, 32)


def test_accelerate_memory_map_and_placement():
    assert wrapped_accelerate.max_memory(2**31, gpu=False, max_gpu_gib=None, max_cpu_gib=None) == {}
    assert (wrapped_accelerate.max_memory(2**31, gpu=True, max_gpu_gib=None, max_cpu_gib=8)
            == {0: "1.000000GiB", "cpu": "8.000000GiB"})
    with pytest.raises(MoespacError, match="--max-gpu-gib"):
        wrapped_accelerate.max_memory(2**31, gpu=True, max_gpu_gib=0, max_cpu_gib=None)
    assert wrapped_accelerate.placement({"": "cpu"}) == dict(modules_per_device={"cpu": 1}, offloaded=False)
    gpu = wrapped_accelerate.placement({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu"})
    assert gpu == dict(modules_per_device={"0": 2, "cpu": 1}, offloaded=True)


def test_common_arguments_checked(tmp_path):
    args = _args(tmp_path)
    _common.check_common_arguments(args)
    with pytest.raises(MoespacError, match="--limit"):
        _common.check_common_arguments(Namespace(**dict(vars(args), limit=0)))
    with pytest.raises(MoespacError, match="draft/config.json"):
        (Path(args.model_pair) / "draft" / "config.json").unlink()
        _common.check_common_arguments(args)


def test_wrapped_package_is_cheap_and_defines_no_policy():
    import baselines.programs as pkg
    from moespac.registry import policies

    assert set(SYSTEMS) == {"llamacpp", "accelerate", "vllm", "moespac-release"}
    assert not [c for c in policies().values() if c.__module__.startswith("baselines.programs")]
    assert "torch" not in vars(pkg)


def test_cli_lists_wrapped_systems():
    from moespac.cli import build_parser

    args = build_parser().parse_args(["wrapped", "llamacpp", "--model-pair", "p", "--out", "o.json", "--draft"])
    assert args.func is llamacpp.main and args.draft and args.draft_max == 8 and args.outtype == "f32"
    args = build_parser().parse_args(["wrapped", "build-llamacpp", "--cuda", "off"])
    assert args.func is llamacpp.main_build and args.cuda == "off"


def test_resolve_cuda_auto_falls_back_with_the_reason(monkeypatch):
    monkeypatch.setattr(llamacpp_build, "cuda_missing_reason", lambda: None)
    monkeypatch.setattr(llamacpp_build, "nvcc_missing_reason", lambda: "nvcc is not on PATH (test)")
    assert llamacpp_build.resolve_cuda("auto") == (False, "nvcc is not on PATH (test)")
    with pytest.raises(MoespacError, match="--cuda on: nvcc"):
        llamacpp_build.resolve_cuda("on")
    monkeypatch.setattr(llamacpp_build, "nvcc_missing_reason", lambda: None)
    assert llamacpp_build.resolve_cuda("auto") == (True, None)


# ---- decoding settings: --temperature and --ignore-eos reach each system and its record

def test_sampling_flags_parse_for_every_wrapped_system():
    from moespac.cli import build_parser

    for system in SYSTEMS:
        args = build_parser().parse_args(["wrapped", system, "--model-pair", "p", "--out", "o.json",
                                          "--temperature", "0.8", "--ignore-eos"])
        assert (args.temperature, args.ignore_eos) == (0.8, True), system
        args = build_parser().parse_args(["wrapped", system, "--model-pair", "p", "--out", "o.json"])
        assert (args.temperature, args.ignore_eos) == (0.0, False), system


def test_negative_temperature_is_refused_naming_the_flag(tmp_path):
    with pytest.raises(MoespacError, match="--temperature -0.5 must be >= 0"):
        _common.check_common_arguments(_args(tmp_path, temperature=-0.5))


def test_vllm_sampling_params_and_skip_record_carry_the_flags(tmp_path, monkeypatch):
    args = _args(tmp_path, temperature=0.8, ignore_eos=True, seed=5, cpu_offload_gb=None, draft=False, draft_max=8,
                 gpu_memory_utilization=0.9)
    assert vllm.sampling_options(args, 64) == dict(max_tokens=64, temperature=0.8, seed=5, ignore_eos=True)
    greedy = _args(tmp_path)
    assert vllm.sampling_options(greedy, 1) == dict(max_tokens=1, temperature=0.0, seed=0, ignore_eos=False)
    monkeypatch.setattr(vllm, "cuda_missing_reason", lambda: "no CUDA GPU visible to torch (test)")
    assert vllm.main(args) == 0
    config = json.loads(Path(args.out).read_text())["config"]
    assert (config["temperature"], config["ignore_eos"], config["seed"]) == (0.8, True, 5)


def test_release_skip_record_carries_the_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(moespac_release, "cuda_missing_reason", lambda: "no CUDA GPU visible to torch (test)")
    args = _args(tmp_path, temperature=0.7, ignore_eos=True, commit=moespac_release.COMMIT, draft_max=8, threads=None)
    assert moespac_release.main(args) == 0
    config = json.loads(Path(args.out).read_text())["config"]
    assert (config["temperature"], config["ignore_eos"]) == (0.7, True)


def test_accelerate_generate_options():
    tok = Namespace(eos_token_id=7, pad_token_id=None)
    greedy = wrapped_accelerate.generate_options(Namespace(temperature=0.0, ignore_eos=False, max_new_tokens=9), tok)
    assert greedy == dict(do_sample=False, eos_token_id=7, pad_token_id=7)
    sampled = wrapped_accelerate.generate_options(Namespace(temperature=0.8, ignore_eos=True, max_new_tokens=9), tok)
    assert sampled == dict(do_sample=True, temperature=0.8, min_new_tokens=9, eos_token_id=7, pad_token_id=7)


class _EosIs:
    """A tokenizer whose end-of-sequence token is another token (so that the micro model "stops" at once)."""

    def __init__(self, tok, eos: int):
        self._tok, self.eos_token_id, self.pad_token_id = tok, eos, eos

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, *a, **kw):
        return self._tok(*a, **kw)


def test_accelerate_ignore_eos_generates_max_new_tokens_on_the_micro_pair(micro_dir, tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from moespac.models import loading

    # make the target's first greedy token of the prompt its EOS: greedy stops after 1 token, --ignore-eos does not
    tok = loading.load_tokenizer(str(micro_dir / "target"))
    (prompt,), _ = _common.benchmark_prompts(tok, "gsm8k", 1, 0, 2048, 8)
    model = AutoModelForCausalLM.from_pretrained(str(micro_dir / "target"), dtype=loading.DTYPES["auto"]).eval()
    with torch.inference_mode():
        first = int(model(torch.tensor([prompt.ids])).logits[0, -1].argmax())
    monkeypatch.setattr(loading, "load_tokenizer", lambda ref, *a, **kw: _EosIs(tok, first))
    run = dict(model_pair=str(micro_dir), benchmark="gsm8k", limit=1, seed=0, max_new_tokens=8, max_context=2048,
               max_gpu_gib=None, max_cpu_gib=None, dtype="auto", out=str(tmp_path / "r.json"))
    greedy = wrapped_accelerate.run_benchmark(Namespace(**run, temperature=0.0, ignore_eos=False))
    assert [r["new_tokens"] for r in greedy["requests"]] == [1]
    assert greedy["sampling"] == dict(generate=dict(do_sample=False))
    sampled = wrapped_accelerate.run_benchmark(Namespace(**run, temperature=0.8, ignore_eos=True))
    assert [r["new_tokens"] for r in sampled["requests"]] == [8] and sampled["timing"] == "wrapped"
    assert (sampled["config"]["temperature"], sampled["config"]["ignore_eos"]) == (0.8, True)
    assert sampled["sampling"]["generate"] == dict(do_sample=True, temperature=0.8, min_new_tokens=8)
    assert greedy["config_hash"] != sampled["config_hash"]
