"""Bad input gets one line naming what is wrong and a non-zero exit, never a traceback, and writes nothing."""

import os
import shutil

import pytest

from moespac.cli import main


def run(capsys, *argv) -> tuple[int, str]:
    """(exit code, stderr) of one CLI call; argparse's own refusals exit through SystemExit."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    return rc, err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))
             and "Loading weights" not in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def broken(micro_dir, tmp_path_factory):
    """Model folders a user might point at by mistake."""
    d = tmp_path_factory.mktemp("broken")
    (d / "empty").mkdir()
    shutil.copytree(micro_dir / "target", d / "truncated")
    weights = d / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: os.path.getsize(weights) // 2])
    (d / "no_tokenizer").mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(micro_dir / "target" / name, d / "no_tokenizer" / name)
    (d / "pickled").mkdir()  # a .bin checkpoint whose unpickling would run a command
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (micro_dir / "target" / name).exists():
            shutil.copy(micro_dir / "target" / name, d / "pickled" / name)
    (d / "pickled" / "pytorch_model.bin").write_bytes(
        b"\x80\x04\x95\x1e\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94"
        b"\x8c\x0btouch PWNED\x94\x85\x94R\x94.")
    (d / "a_file").write_text("x")
    (d / "random.npz").write_bytes(os.urandom(512))
    (d / "bad.yaml").write_text("a: [1\n b")
    return d


def generate(micro_dir, *extra, target=None):
    return ["generate", "--target", target or micro_dir / "target", "--draft", micro_dir / "draft", "--prompt", "hi",
            "--max-new-tokens", 2, *extra]


@pytest.mark.parametrize("case, needles", [
    ("not-a-model", ["target", "not a model folder"]),
    ("truncated", ["target", "cannot be read", "SafetensorError"]),
    ("pickle", ["target", "cannot be read", "UnpicklingError"]),
    ("no-tokenizer", ["tokenizer", "no tokenizer"]),
    ("cache-gib-nan", ["--cache-gib", "finite"]),
    ("cache-gib-inf", ["--cache-gib", "finite"]),
    ("temperature-nan", ["--temperature", "finite"]),
    ("device", ["--device", "tpu"]),
    ("json-folder", ["--json", "is a folder"]),
    ("non-utf8-prompt", ["--prompt", "UTF-8"]),
    ("huge-gamma", ["gamma 100000", "context"]),
])
def test_generate_refuses_bad_input_in_one_line(capsys, micro_dir, broken, case, needles):
    argv = {
        "not-a-model": generate(micro_dir, target=broken / "empty"),
        "truncated": generate(micro_dir, target=broken / "truncated"),
        "pickle": generate(micro_dir, target=broken / "pickled"),
        "no-tokenizer": generate(micro_dir, target=broken / "no_tokenizer"),
        "cache-gib-nan": generate(micro_dir, "--cache-gib", "nan"),
        "cache-gib-inf": generate(micro_dir, "--cache-gib", "inf"),
        "temperature-nan": generate(micro_dir, "--temperature", "nan"),
        "device": generate(micro_dir, "--device", "tpu"),
        "json-folder": generate(micro_dir, "--json", broken),
        "non-utf8-prompt": generate(micro_dir)[:-4] + ["--prompt", b"\xff\xfe hi".decode("utf-8", "surrogateescape"),
                                                       "--max-new-tokens", 2],
        "huge-gamma": generate(micro_dir, "--gamma", 100000),
    }[case]
    rc, err = run(capsys, *argv)
    line = one_line(err)
    assert rc == 2, err
    for needle in needles:
        assert needle in line, line
    assert not os.path.exists("PWNED")  # the refused pickle ran nothing


def test_other_commands_refuse_bad_paths_in_one_line(capsys, micro_dir, broken, tmp_path):
    trace = tmp_path / "t.npz"
    from moespac.policy import Topology
    from moespac.sim.synthetic import synthetic_trace, toy_spec

    topo = Topology(2, 8, 2)
    synthetic_trace(topo, new_tokens=8, gamma=2, seed=0, model_spec=toy_spec(topo)).save(trace)
    shape, listed = tmp_path / "shape.json", tmp_path / "list.json"
    shape.write_text('{"kind": "bench", "timing": "simulated", "config_hash": "x", "metrics": []}')
    listed.write_text("[1, 2]")
    import json

    import numpy as np

    arrays = dict(np.load(trace, allow_pickle=False))
    arrays["meta"] = np.frombuffer(json.dumps([1, 2]).encode(), dtype=np.uint8)
    bad_meta = tmp_path / "meta.npz"
    np.savez(bad_meta, **arrays)
    cases = [
        (["simulate", "--trace", trace, "--hardware", broken, "--policy", "lru"], ["hardware profile", "is a folder"]),
        (["simulate", "--trace", trace, "--hardware", "rtx4090-pcie4", "--policy", "lru", "--json", broken],
         ["--json", "is a folder"]),
        (["simulate", "--trace", broken / "random.npz", "--hardware", "rtx4090-pcie4", "--policy", "lru"],
         ["random.npz", "not a trace"]),
        (["simulate", "--trace", trace, "--hardware", broken / "bad.yaml", "--policy", "lru"],
         ["bad.yaml", "line 2"]),
        (["simulate", "--trace", trace, "--hardware", "rtx4090-pcie4", "--policy", "moespac:adaptive=maybe"],
         ["adaptive", "true or false"]),
        (["make-micro", "--out", broken / "a_file"], ["--out", "is a file"]),
        (["report", "table", "table1", shape, "--out", tmp_path / "t1"], ["shape.json", "schema violation"]),
        (["report", "table", "table1", listed, "--out", tmp_path / "t1"], ["list.json", "not a record"]),
        (["simulate", "--trace", bad_meta, "--hardware", "rtx4090-pcie4", "--policy", "lru"],
         ["meta.npz", "not a mapping"]),
        (["bench", "--model-pair", micro_dir, "--benchmark", "gsm8k", "--limit", 1, "--out", broken],
         ["--out", "is a folder"]),
        (["bench", "--model-pair", micro_dir, "--benchmark", "gsm8k", "--limit", 1, "--gamma", 100000, "--no-progress",
          "--out", tmp_path / "g.json"], ["gamma 100000", "context of 4096"]),
    ]
    for argv, needles in cases:
        rc, err = run(capsys, *argv)
        line = one_line(err)
        assert rc == 2, (argv, err)
        for needle in needles:
            assert needle in line, (argv, line)
    assert sorted(p.name for p in broken.iterdir()) == ["a_file", "bad.yaml", "empty", "no_tokenizer", "pickled",
                                                         "random.npz", "truncated"]  # nothing written


def test_an_unknown_hub_id_fails_at_once_when_the_hub_is_unreachable(capsys, monkeypatch):
    """No local copy and no hub (a closed port stands in for a machine without internet): one line at once,
    not after the hub client's ~30 s of retries."""
    import time

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    t0 = time.monotonic()
    rc, err = run(capsys, "generate", "--target", "org/no-such-model", "--draft", "org/no-such-draft", "--prompt", "hi")
    assert rc == 2 and time.monotonic() - t0 < 10
    line = one_line(err)
    assert "org/no-such-model" in line and "hf download" in line


def test_outputs_are_readable_by_the_group_like_any_file_open_makes(tmp_path):
    """Atomic writes go through mkstemp (0600); the result gets the mode open() would give it (umask 022: 0644)."""
    from moespac.atomic import write_json

    old = os.umask(0o022)
    try:
        write_json(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert oct((tmp_path / "r.json").stat().st_mode & 0o777) == "0o644"


def test_version(capsys):
    from moespac import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"moespac {__version__}"
