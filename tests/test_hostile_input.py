"""What a hostile but honest user types: every bad command line exits non-zero with one line on stderr that names
the offending flag, key, file or value, no traceback, and not one file created or changed in the folder it ran
in (outputs that would replace an input, outputs in a folder that takes no file, corrupt and crafted inputs,
degenerate numbers)."""

import base64
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from moespac.cli import main


def snapshot(root: Path) -> dict[str, str]:
    """Every file and link under root, with a hash of its bytes (links by target): what a command must not touch."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def _sglang(rate, verify_ct) -> str:
    ids = np.tile(np.array([[[0, 1]]], dtype="<i4"), (5, 1, 1))  # 2 prompt + 4 completion tokens - 1 rows
    meta = dict(id="a", prompt_tokens=2, completion_tokens=4, routed_experts=base64.b64encode(ids.tobytes()).decode(),
                spec_accept_rate=rate, spec_verify_ct=verify_ct)
    return json.dumps({"meta_info": meta}) + "\n"


def _unwritable(d: Path) -> str:
    """A folder no file can be created in, even by root: immutable where chattr works, else read-only, else a file
    standing where the folder should be. Returns how it was made."""
    d.mkdir()
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0:
        return "immutable"
    d.chmod(0o555)
    try:
        (d / ".probe").write_text("x")
    except OSError:
        return "read-only"
    (d / ".probe").unlink()
    d.chmod(0o755)
    d.rmdir()
    d.write_text("a file where a folder is expected")
    return "a file"


@pytest.fixture(scope="module")
def work(micro_dir, tmp_path_factory):
    """A folder with the files a user has: a trace, a routing log, hostile files of every kind, a folder that takes
    no file."""
    d = tmp_path_factory.mktemp("hostile")
    shutil.copytree(micro_dir, d / "micro")
    assert main(["bench", "--model-pair", str(d / "micro"), "--benchmark", "gsm8k", "--limit", "1", "--max-new-tokens",
                 "6", "--gamma", "4", "--warmup", "0", "--no-progress", "--trace", str(d / "v.npz"),
                 "--out", str(d / "rec.json")]) == 0
    os.symlink("v.npz", d / "link.npz")
    data = bytearray((d / "v.npz").read_bytes())
    for i in range(200, 260):  # inside the first member's deflated bytes: the zip directory still reads
        data[i] ^= 0xFF
    (d / "corrupt.npz").write_bytes(bytes(data))
    line = lambda t, ids: json.dumps({"request": "r", "token": t, "prefill": t < 2, "layers": [ids]})
    (d / "good.jsonl").write_text("".join(line(t, [t % 8, (t + 1) % 8]) + "\n" for t in range(6)))
    (d / "huge_id.jsonl").write_text(line(0, [10**30, 1]) + "\n")
    (d / "id_40000.jsonl").write_text(line(0, [40000, 1]) + "\n")
    (d / "nested.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (d / "not_utf8.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    (d / "nan_rate.jsonl").write_text(_sglang(float("nan"), 2))
    (d / "negative_ct.jsonl").write_text(_sglang(0.5, -2))
    made = _unwritable(d / "ro")
    yield d, made
    if made == "immutable":
        subprocess.run(["chattr", "-i", str(d / "ro")], check=True)
    elif made == "read-only":
        (d / "ro").chmod(0o755)


SIM = ["--hardware", "rtx4090-pcie4"]
CASES = {
    # an output that is an input, or another output (symlinks and ./ spellings included)
    "bench-out-is-its-trace": (["bench", "--timing", "simulated", *SIM, "--benchmark", "gsm8k", "--method", "moespac",
                                "--from-trace", "v.npz", "--out", "v.npz"], ["--out v.npz", "--from-trace"]),
    "simulate-json-is-its-trace": (["simulate", "--trace", "v.npz", "--policy", "lru", *SIM, "--json", "./v.npz"],
                                   ["--json ./v.npz", "--trace"]),
    "derive-out-is-a-link-to-its-input": (["derive-ar-trace", "v.npz", "--out", "link.npz"],
                                          ["--out link.npz", "input"]),
    "import-out-is-its-input": (["import-trace", "good.jsonl", "--format", "jsonl", "--gamma", "0",
                                 "--num-experts", "8", "--out", "good.jsonl"], ["--out good.jsonl", "FILE"]),
    "generate-two-outputs-one-path": (["generate", "--target", "micro/target", "--draft", "micro/draft",
                                       "--prompt", "hi", "--json", "same.out", "--trace", "same.out"],
                                      ["--trace same.out", "--json"]),
    "bench-trace-is-its-out": (["bench", "--model-pair", "micro", "--benchmark", "gsm8k", "--trace", "x.json", "--out",
                                "x.json"], ["--trace x.json", "--out"]),
    "derive-json-is-its-out": (["derive-ar-trace", "v.npz", "--out", "x.npz", "--json", "./x.npz"], ["--json ./x.npz"]),
    # corrupt trace: a zip whose member fails to inflate
    "simulate-corrupt-trace": (["simulate", "--trace", "corrupt.npz", "--policy", "lru", *SIM], ["corrupt.npz"]),
    "derive-corrupt-trace": (["derive-ar-trace", "corrupt.npz", "--out", "c.npz"], ["corrupt.npz"]),
    "bench-corrupt-trace": (["bench", "--timing", "simulated", *SIM, "--benchmark", "gsm8k", "--from-trace",
                             "corrupt.npz", "--out", "c.json"], ["corrupt.npz"]),
    # an output in a folder that takes no file; with several outputs, none is written
    "derive-out-unwritable": (["derive-ar-trace", "v.npz", "--out", "ro/x.npz"], ["--out ro/x.npz"]),
    "derive-second-output-unwritable": (["derive-ar-trace", "v.npz", "--out", "ok.npz", "--json", "ro/x.json"],
                                        ["--json ro/x.json"]),
    "plan-json-unwritable": (["plan", "--target", "micro/target", "--json", "ro/x.json"], ["--json ro/x.json"]),
    "audit-out-unwritable": (["report", "audit", "--out", "ro/a.md"], ["--out ro/a.md"]),
    "track-summary-unwritable": (["track", "ingest", "--outputs", "good.jsonl", "--summary", "ro/s.json",
                                  "--tracking-uri", "sqlite:///m.db"], ["--summary ro/s.json"]),
    # huge or degenerate numbers
    "plan-gpu-gib-1e300": (["plan", "--target", "micro/target", "--gpu-gib", "1e300"], ["--gpu-gib", "1e300"]),
    "simulate-cache-gib-1e308": (["simulate", "--trace", "v.npz", "--policy", "lru", *SIM, "--cache-gib", "1e308"],
                                 ["--cache-gib", "1e308"]),
    "check-lossless-no-gammas": (["check-lossless", "--target", "micro/target", "--draft", "micro/draft", "--gammas",
                                  ""], ["--gammas"]),
    "calibrate-163-TB-expert": (["calibrate", "--out", "cal.yaml", "--expert-ffn", "10000000000"],
                                ["--expert-ffn 10000000000"]),
    "plan-context-past-the-model": (["plan", "--target", "micro/target", "--context", "99999999999999999999"],
                                    ["--context 99999999999999999999"]),
    "policy-option-twice": (["simulate", "--trace", "v.npz", "--policy", "moespac:K=1,K=2", *SIM], ["'K'", "twice"]),
    # routing logs a user did not mean to hand over
    "import-id-1e30": (["import-trace", "huge_id.jsonl", "--format", "jsonl", "--gamma", "0", "--num-experts", "8",
                        "--out", "o.npz"], ["huge_id.jsonl:1", "1000000000000000000000000000000"]),
    "import-deeply-nested": (["import-trace", "nested.jsonl", "--format", "jsonl", "--gamma", "0", "--num-experts", "8",
                              "--out", "o.npz"], ["nested.jsonl:1", "nested"]),
    "import-not-utf8": (["import-trace", "not_utf8.jsonl", "--format", "jsonl", "--gamma", "0", "--num-experts", "8",
                         "--out", "o.npz"], ["not_utf8.jsonl:1", "UTF-8"]),
    "import-nan-accept-rate": (["import-trace", "nan_rate.jsonl", "--format", "sglang", "--top-k", "2",
                                "--num-experts", "8", "--out", "o.npz"], ["spec_accept_rate", "nan"]),
    "import-negative-verify-count": (["import-trace", "negative_ct.jsonl", "--format", "sglang", "--top-k", "2",
                                      "--num-experts", "8", "--out", "o.npz"], ["spec_verify_ct", "-2"]),
    "import-70000-experts": (["import-trace", "id_40000.jsonl", "--format", "jsonl", "--gamma", "0", "--num-experts",
                              "70000", "--out", "o.npz"], ["--num-experts 70000", "int16"]),
    "import-id-past-int16": (["import-trace", "id_40000.jsonl", "--format", "jsonl", "--gamma", "0", "--num-experts",
                              "8", "--out", "o.npz"], ["id_40000.jsonl:1", "40000"]),
    # tracking
    "track-missing-output": (["track", "ingest", "--outputs", "missing.png", "--tracking-uri", "sqlite:///m.db"],
                             ["--outputs missing.png"]),
    "track-bad-uri": (["track", "ingest", "--outputs", "good.jsonl", "--tracking-uri", "badscheme://x"],
                      ["badscheme://x"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_touches_nothing(work, case, capsys, monkeypatch):
    d, _ = work
    argv, needles = CASES[case]
    monkeypatch.chdir(d)
    before = snapshot(d)
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own refusals
        rc = e.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert rc not in (0, None) and "Traceback" not in err, err[-2000:]
    assert len(lines) == 1, err[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert snapshot(d) == before


def test_the_unwritable_folder_is_really_unwritable(work):
    """The cases above that name ro/ mean something only if ro/ takes no file."""
    d, made = work
    with pytest.raises(OSError):
        (d / "ro" / "probe").write_text("x")
    assert made in ("immutable", "read-only", "a file")
