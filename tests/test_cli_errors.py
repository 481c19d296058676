"""Bad input -> one-line error naming the problem, non-zero exit, nothing written."""

import subprocess
import sys

import pytest

from moespac.models.micro import build_micro


def moespac(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "moespac", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, timeout=300)


def generate_args(micro_dir, **over):
    a = dict(target=micro_dir / "target", draft=micro_dir / "draft", prompt="hi", max_new_tokens=4)
    a.update(over)
    out = ["generate", "--greedy"]
    for k, v in a.items():
        out += [f"--{k.replace('_', '-')}", v]
    return out


def assert_error(r, *needles):
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("moespac generate: error:"), r.stderr
    for n in needles:
        assert n in last, last


def test_unknown_hub_id_says_offline(micro_dir, tmp_path):
    r = moespac(*generate_args(micro_dir, target="nobody/no-such-moe", json=tmp_path / "r.json"))
    assert_error(r, "nobody/no-such-moe", "offline", "local folder")
    assert not (tmp_path / "r.json").exists()


def test_missing_folder(micro_dir):
    assert_error(moespac(*generate_args(micro_dir, target="./no/such/dir")), "no such folder")


def test_non_moe_target(micro_dir):
    assert_error(moespac(*generate_args(micro_dir, target=micro_dir / "draft")), "not an MoE model")


def test_vocab_mismatch(micro_dir, tmp_path):
    _, draft, tok = build_micro("qwen3_moe", vocab_size=300)
    draft.save_pretrained(tmp_path / "d")
    assert_error(moespac(*generate_args(micro_dir, draft=tmp_path / "d")), "vocabulary")


@pytest.mark.parametrize("key,value,needle", [("gamma", 0, "--gamma 0"), ("cache_ratio", 1.5, "--cache-ratio 1.5")])
def test_bad_numbers(micro_dir, tmp_path, key, value, needle):
    r = moespac(*generate_args(micro_dir, **{key: value, "json": tmp_path / "r.json"}))
    assert_error(r, needle)
    assert not (tmp_path / "r.json").exists()


def test_generate_writes_record_and_trace(micro_dir, tmp_path):
    r = moespac(*generate_args(micro_dir, json=tmp_path / "r.json", trace=tmp_path / "t.npz", max_new_tokens=12))
    assert r.returncode == 0, r.stderr
    assert "tokens/s" in r.stdout and "acceptance rate" in r.stdout and "cache hit rate" in r.stdout
    import json

    rec = json.loads((tmp_path / "r.json").read_text())
    assert rec["timing"] == "measured" and rec["metrics"]["new_tokens"] == 12 and len(rec["config_hash"]) == 12
    from moespac.trace import load_trace

    assert load_trace(tmp_path / "t.npz").num_steps >= 2
