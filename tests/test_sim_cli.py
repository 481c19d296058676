"""`moespac simulate` and `moespac calibrate` end to end, the result record, topology checks."""

import json

import numpy as np
import pytest

from moespac.cli import main
from moespac.errors import MoespacError
from moespac.models.specs import get_spec
from moespac.policy import Topology
from moespac.bench.calibrate import last_level_cache_bytes
from moespac.sim.profile import load_profile
from moespac.sim.synthetic import hand_trace, synthetic_trace, toy_spec
from moespac.sim.workload import make_workload


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    topo = Topology(4, 8, 2)
    path = tmp_path_factory.mktemp("sim") / "trace.npz"
    synthetic_trace(topo, new_tokens=24, gamma=3, prompt_tokens=8, model_spec=toy_spec(topo, 64, 32), seed=1).save(path)
    return path


def test_simulate_writes_a_simulated_record(trace_path, tmp_path, capsys):
    out = tmp_path / "rec.json"
    rc = main(["simulate", "--trace", str(trace_path), "--policy", "lru", "--hardware", "rtx4090-pcie4",
               "--cache-ratio", "0.25", "--json", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    profile = load_profile("rtx4090-pcie4")
    assert rec["timing"] == "simulated" and rec["kind"] == "simulate"
    assert rec["profile"]["name"] == "rtx4090-pcie4" and rec["profile"]["sha256"] == profile.sha256
    assert rec["trace"]["id"] == "synthetic-4x8-k2-g3-n24-s1" and rec["trace"]["path"] == str(trace_path)
    assert rec["model_spec"] == "toy-4x8-k2" and rec["policy"] == {"name": "lru", "options": {}, "stats": {}}
    assert rec["config"]["hardware_sha256"] == profile.sha256 and rec["cache"]["slots"] == 8  # 0.25 x 32
    assert rec["draft"]["source"].startswith("default (qwen3-4b-fp8")
    m = rec["metrics"]
    assert m["tokens"] == 23 and m["tokens_per_s"] == pytest.approx(23 / m["decode_s"])
    assert set(m["breakdown_decode_s"]) == {"draft", "attention", "other", "stall", "expert", "expert_device",
                                            "expert_host"}
    assert m["link_bytes"] == m["counters"]["bytes_copied"] > 0
    b = rec["bounds"]
    assert b["infinite_cache"]["tokens_per_s"] >= m["tokens_per_s"]
    assert rec["distance"]["of_infinite_cache"] == pytest.approx(m["tokens_per_s"]
                                                                 / b["infinite_cache"]["tokens_per_s"])
    text = capsys.readouterr().out
    assert "simulated: lru on rtx4090-pcie4" in text and "tokens/s" in text and "bounds:" in text
    from moespac.analysis.rows import record_row

    with pytest.raises(MoespacError, match="trace that names no benchmark is not a table cell"):
        record_row(out)  # a synthetic trace has no benchmark: no table reads its replay


def test_simulate_with_another_models_expert_sizes(trace_path, tmp_path):
    out = tmp_path / "rec.json"
    args = ["simulate", "--trace", str(trace_path), "--policy", "all-host", "--hardware", "h200",
            "--model-spec", "qwen3-30b-a3b", "--no-bounds", "--json", str(out)]
    assert main(args) == 2  # 4 x 8 x top-2 is not Qwen3's 48 x 128 x top-8
    assert main(args + ["--allow-topology-mismatch"]) == 0
    rec = json.loads(out.read_text())
    assert rec["model_spec"] == "qwen3-30b-a3b" and "modulo" in rec["topology_mapping"]
    assert rec["cache"]["expert_bytes"] == get_spec("qwen3-30b-a3b").expert_bytes() and "bounds" not in rec


def test_topology_mismatch_names_the_keys():
    topo = Topology(2, 4, 2)
    trace = hand_trace(topo, [("prefill", 0, 1, [[[0, 1], [2, 3]]])])
    with pytest.raises(MoespacError) as e:
        make_workload(trace, toy_spec(Topology(3, 4, 1)))
    assert "num_layers=2 != spec num_moe_layers=3" in str(e.value) and "top_k=2 != spec top_k=1" in str(e.value)
    assert "num_experts" not in str(e.value)


def test_modulo_mapping_of_layers_and_experts():
    # trace 2 layers x 4 experts -> spec 3 layers x 2 experts: spec layer 2 replays trace layer 0,
    # trace experts 0/2 and 1/3 fold onto spec experts 0 and 1
    topo = Topology(2, 4, 2)
    trace = hand_trace(topo, [("prefill", 0, 1, [[[0, 2], [1, 2]]])])
    w = make_workload(trace, toy_spec(Topology(3, 2, 2)), allow_topology_mismatch=True)
    assert w.counts[0].tolist() == [[2, 0], [1, 1], [2, 0]]
    assert w.topology == Topology(3, 2, 2)


def test_bad_profile_through_the_cli(trace_path, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nlink_bandwidth: {value: 0, unit: B/s, source: x}\n")
    assert main(["simulate", "--trace", str(trace_path), "--policy", "lru", "--hardware", str(bad)]) == 2
    assert "'link_bandwidth' must be positive" in capsys.readouterr().err


def test_calibrate_on_this_cpu(tmp_path, capsys):
    out = tmp_path / "here.yaml"
    assert main(["calibrate", "--out", str(out), "--hidden", "64", "--expert-ffn", "32", "--repeats", "1",
                 "--tokens", "1,4,64", "--threads", "1", "--name", "here"]) == 0
    p = load_profile(out)
    assert p.name == "here" and p.device_is_host and "CPU-only" in p.notes
    assert p.device_mem_bandwidth == p.host_mem_bandwidth and p.device_flops == p.host_flops
    assert p.launch_overhead == p.host_op_overhead
    assert "measured" in p.sources["host_mem_bandwidth"] and "memcpy" in p.sources["link_bandwidth"]
    assert "micro models" in p.sources["layer_overhead"] and p.layer_overhead >= 0 and p.forward_overhead >= 0
    assert "CPU-only: device = host" in capsys.readouterr().out
    assert np.isfinite([p.link_bandwidth, p.host_flops]).all()
    assert "per load" in p.sources["copy_overhead"] and p.copy_overhead >= 0  # the whole on-demand path, timed
    llc = last_level_cache_bytes()
    if llc:  # this machine's sysfs names one (CI's does); where it cannot be read, the profile leaves it out
        assert p.host_cache_bytes == llc and p.host_cache_bandwidth > 0
    else:
        assert p.host_cache_bytes == 0 and "host_cache_bytes" not in p.sources


def test_simulate_the_oracle_itself(trace_path, tmp_path):
    out = tmp_path / "oracle.json"
    assert main(["simulate", "--trace", str(trace_path), "--policy", "oracle:prefetch=false", "--hardware", "h200",
                 "--cache-ratio", "0.5", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["policy"]["options"] == {"prefetch": False}
    assert rec["policy"]["stats"] == {"prefetch": False, "eager": False, "credit": False, "host": True, "plan": "best"}
    # every request names the plan it kept (on demand only, static start, static: none prefetches)
    assert all(q["plan"]["plan"] in ("dynamic", "hybrid", "static") and not q["plan"]["prefetch"]
               for q in rec["requests"])
    assert rec["metrics"]["tokens_per_s"] <= rec["bounds"]["infinite_cache"]["tokens_per_s"] * (1 + 1e-9)


def test_warmup_steps_sets_the_fiddler_profiling_window(trace_path, tmp_path, capsys):
    out = tmp_path / "fiddler.json"
    args = ["simulate", "--trace", str(trace_path), "--policy", "fiddler", "--hardware", "h200", "--no-bounds",
            "--json", str(out)]
    assert main(args + ["--warmup-steps", "0"]) == 2  # no window: fiddler lacks its signal
    assert "'warmup_counts'" in capsys.readouterr().err and not out.exists()
    assert main(args + ["--warmup-steps", "-1"]) == 2
    assert "warmup_steps -1 must be >= 0" in capsys.readouterr().err
    assert main(args + ["--warmup-steps", "4"]) == 0
    rec = json.loads(out.read_text())
    assert (rec["config"]["warmup_steps"] == 4 and rec["warmup_window"]["steps"] == 4
            and rec["warmup_window"]["request"] == 0)
    # routing entries of a prefill of 8 tokens and 3 verify steps of gamma + 1 = 4 tokens, 4 layers x top-2
    assert rec["warmup_window"]["entries"] == (8 + 3 * 4) * 4 * 2


def test_bench_simulated_takes_warmup_steps(micro_dir, tmp_path, capsys):
    trace, out = tmp_path / "t.npz", tmp_path / "sim.json"
    common = ["bench", "--benchmark", "gsm8k", "--timing", "simulated", "--hardware", "h200", "--policy", "fiddler",
              "--no-progress"]
    assert main(common + ["--model-pair", str(micro_dir), "--gamma", "2", "--limit", "1", "--max-new-tokens", "4",
                          "--ignore-eos", "--warmup-steps", "2", "--trace", str(trace), "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["config"]["warmup_steps"] == 2 and rec["policy"]["warmup_window"]["steps"] == 2
    assert rec["simulation"]["warmup_window"] == rec["policy"]["warmup_window"]
    capsys.readouterr()
    replay = common + ["--from-trace", str(trace), "--out", str(tmp_path / "again.json")]
    assert main(replay + ["--warmup-steps", "0"]) == 2 and "'warmup_counts'" in capsys.readouterr().err
    assert main(replay + ["--warmup-steps", "-3"]) == 2 and "warmup_steps -3 must be >= 0" in capsys.readouterr().err
    assert main(replay) == 0  # the simulator's default window
    assert json.loads((tmp_path / "again.json").read_text())["config"]["warmup_steps"] == 16
    measured = ["bench", "--benchmark", "gsm8k", "--model-pair", str(micro_dir), "--warmup-steps", "2",
                "--out", str(tmp_path / "m.json")]
    assert main(measured) == 2 and "warmup_steps / profile_traces need timing 'simulated'" in capsys.readouterr().err


def test_simulate_on_a_bench_trace_writes_the_cell_bench_writes(micro_dir, tmp_path, capsys):
    """One simulated-record path: `moespac simulate` on a trace `moespac bench` recorded writes the very record
    `moespac bench --timing simulated --from-trace` writes (a table cell, its method included)."""
    trace = tmp_path / "t.npz"
    assert main(["bench", "--benchmark", "gsm8k", "--model-pair", str(micro_dir), "--gamma", "2", "--limit", "2",
                 "--max-new-tokens", "4", "--ignore-eos", "--timing", "simulated", "--hardware", "h200",
                 "--trace", str(trace), "--out", str(tmp_path / "first.json"), "--no-progress"]) == 0
    cell = ["--hardware", "rtx4090-pcie4", "--cache-ratio", "0.25", "--no-bounds"]
    assert main(["bench", "--benchmark", "gsm8k", "--timing", "simulated", "--from-trace", str(trace),
                 "--method", "lru-sd", "--out", str(tmp_path / "bench.json"), "--no-progress", *cell]) == 0
    capsys.readouterr()
    assert main(["simulate", "--trace", str(trace), "--method", "lru-sd", "--policy", "lru", "--json",
                 str(tmp_path / "sim.json"), *cell]) == 0
    assert "simulated: lru on GSM8K" in capsys.readouterr().out
    bench, sim = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("bench", "sim"))
    assert sim["kind"] == "bench" and sim["method"] == "lru-sd" and sim["config_hash"] == bench["config_hash"]
    assert sim == bench  # a simulated record holds no clock reading: equal, key for key
    # a cell is the paper's protocol; a trace that names no benchmark is no cell
    assert main(["simulate", "--trace", str(trace), "--policy", "lru", "--warm-cache", *cell]) == 2
    assert "its replay is a table cell, which has no --expert-dtype or --warm-cache" in capsys.readouterr().err
