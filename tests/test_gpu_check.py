"""The prepared GPU check's dry mode: every step of benchmarks/gpu_engine_check.py at toy size on this CPU, so
that the script a rare GPU loan runs cannot rot."""

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_gpu_check_dry_mode_runs_every_step(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    r = subprocess.run(["bash", str(REPO / "benchmarks/gpu_engine_check.sh"), str(tmp_path), "--dry"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu_engine_check.json").read_text())
    assert summary["failed"] == {} and summary["skipped"] == []
    assert summary["versions"]["moespac_from"] == str(REPO / "moespac")  # this tree, not an installed copy
    log = (tmp_path / "gpu_engine_check.log").read_text()
    assert log.startswith(f"# command: python benchmarks/gpu_engine_check.py --out {tmp_path} --dry")
    for arch in ("qwen3_moe", "deepseek_v2"):
        assert summary["lossless"][arch]["mismatches"] == 0 and summary["lossless"][arch]["copies"] > 0
    assert (summary["lossless"]["sampling"]["p_value"] > 0.01
            > summary["lossless"]["sampling"]["negative_control_p_value"])
    for name, p in summary["full_size"]["policies"].items():
        assert p["measured_tokens_per_s"] > 0 and p["simulated_tokens_per_s"] > 0, name
        assert p["phases"]["moe layers"] > 0 and Path(p["trace"]).is_file()
    assert (tmp_path / "this-machine.yaml").is_file()
