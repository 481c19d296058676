"""One prepared check of the engine on a GPU, sized for a 15-minute loan of one machine with no internet.

    python benchmarks/gpu_engine_check.py --out results/gpu            # the real check (CUDA), <= 8 min on an H200
    python benchmarks/gpu_engine_check.py --out /tmp/dry --dry         # every step at toy size on a CPU (CI runs it)

Steps (each prints what it measured; the log and a JSON summary go to --out):
1. versions of torch, transformers and CUDA found, refused in one line when outside what the project supports;
2. lossless on the device: greedy speculative output identical to Hugging Face's generate() in float64 on two
   architectures (Qwen3-MoE, DeepSeek-V2) over cache ratios 0 / 0.25 / 1 and gamma 1 / 4 / 8, with the
   ordering checker on; the sampling distribution test with its negative control;
3. a random-weight model of Qwen3-30B-A3B's real shape (48 x 128 experts, hidden 2048, expert width 768, top-8,
   bf16) built on the GPU with a skewed router, its slot pool sized by the memory plan for a 24 GB device;
   the engine runs MoE-SpAc and llama.cpp's placement for 512 tokens with a small random dense draft,
   recording the trace; a profile of this machine is calibrated and the trace simulated on it: measured vs
   simulated tokens/s per policy (goal: within 15 %), peak device and host memory against the plan, and the
   host time of each engine phase.
Nothing here needs the network: the models are random, the prompts are token ids.
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import time
from pathlib import Path

import moespac  # before torch: importing it pins the CPU kernels' instruction set (moespac/pinning.py)
import torch  # noqa: E402, I001

FULL = dict(layers=48, experts=128, top_k=8, hidden=2048, ffn=768, heads=32, kv_heads=4, head_dim=128, vocab=32000,
            tokens=512, draft_layers=4, draft_hidden=1024, dtype=torch.bfloat16, gpu_gib=24.0)
DRY = dict(layers=4, experts=16, top_k=4, hidden=64, ffn=32, heads=4, kv_heads=2, head_dim=16, vocab=320,
           tokens=16, draft_layers=1, draft_hidden=32, dtype=torch.float32, gpu_gib=None)
POLICIES = ("moespac", "llamacpp")


def log(out: list, text: str) -> None:
    print(text, flush=True)
    out.append(text)


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def check_versions(lines, dry: bool) -> tuple[dict, list[str]]:
    """Step 1: the versions found, and one line for each thing this machine cannot do on them. Returns (versions,
    the steps that cannot run here); every other step runs."""
    from packaging.version import Version

    found = dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
                 gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                 **{name: _version(name) for name in ("transformers", "tokenizers", "safetensors", "numpy", "numba",
                                                      "mlflow", "snakemake")},
                 moespac_from=str(Path(moespac.__file__).resolve().parent))
    log(lines, "versions: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    cannot = []
    tv = found["transformers"]
    if tv is None or not Version("5.7") <= Version(tv) < Version("6"):
        cannot += ["lossless", "full_size"]
        log(lines, f"cannot: transformers {tv} is outside >=5.7,<6 (the experts interface): no engine step runs")
    torch_v = Version(torch.__version__.split("+")[0])
    if torch_v < Version("2.6"):
        cannot += ["lossless", "full_size"]
        log(lines, f"cannot: torch {torch.__version__} is older than 2.6: no engine step runs")
    elif torch_v < Version("2.13"):
        # the CPU rehearsal in CI runs 2.13; the engine's CUDA calls are checked against 2.10-2.12 (kernels.py)
        log(lines, f"note: torch {torch.__version__} is older than the 2.13 CI tests; the device path takes the "
                   "calls it has (grouped_mm on CUDA, a per-group loop on a CPU before 2.13)")
    if not dry and not torch.cuda.is_available():
        cannot += ["lossless", "full_size"]
        log(lines, "cannot: no CUDA device here (--dry runs every step at toy size on the CPU)")
    for absent in ("mlflow", "snakemake"):
        if found[absent] is None:
            log(lines, f"note: no {absent}: not needed here (this check runs the engine and the simulator only)")
    return found, sorted(set(cannot))


def lossless(lines, device: str, runs: int) -> dict:
    from moespac.engine.device import Device, OrderChecker
    from moespac.engine.session import EngineConfig, EngineSession
    from moespac.engine.speculative import Sampling
    from moespac.lossless import check_lossless, sampling_pvalue, target_joint
    from moespac.models.micro import build_micro

    out = {}
    for arch in ("qwen3_moe", "deepseek_v2"):
        target, draft, tok = build_micro(arch, dtype=torch.float64, seed=3)
        target.to(device)
        draft.to(device)
        prompts = [tok.encode(t) for t in ("def add(a, b):", "The quick brown fox")]
        checker = OrderChecker()
        n, bad = check_lossless(target, draft, prompts, gammas=[1, 4, 8], cache_ratios=[0.0, 0.25, 1.0],
                                policy="moespac", max_new_tokens=16, device=Device(device, checker))
        out[arch] = dict(sequences=n, mismatches=len(bad), copies=checker.copies, reads=checker.reads)
        log(lines, f"lossless {arch} on {device}: {n - len(bad)}/{n} sequences identical to HF generate() "
                   f"(float64; {checker.copies} copies and {checker.reads} slot reads, all ordered)")
    from moespac.engine import speculative

    target, draft, tok = build_micro("qwen3_moe", dtype=torch.float64, seed=2)
    target.to(device)
    draft.to(device)
    prompt = tok.encode("def add(a, b):")
    expected = target_joint(target, prompt, Sampling(temperature=1.0, top_k=3))
    session = EngineSession(target, draft, None, EngineConfig(target="micro", policy="lru", cache_ratio=0.25),
                            device=device)
    real = speculative.stochastic_accept
    try:
        good = sampling_pvalue(session, prompt, expected, runs)

        def wrong(p, q, drafts, gen):  # negative control: resample from p on rejection, not from max(p - q, 0)
            for i, x in enumerate(drafts.tolist()):
                if torch.rand((), generator=gen, dtype=torch.float64, device=p.device) * q[i, x] <= p[i, x]:
                    continue
                return i, int(torch.multinomial(p[i], 1, generator=gen))
            return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=gen))
        speculative.stochastic_accept = wrong
        bad = sampling_pvalue(session, prompt, expected, runs)
    finally:
        speculative.stochastic_accept = real
        session.close()
    out["sampling"] = dict(p_value=good, negative_control_p_value=bad)
    log(lines, f"sampled SD on {device}: chi-square p = {good:.3f} (pass > 0.01: {'OK' if good > 0.01 else 'FAIL'}); "
               f"negative control p = {bad:.2e} (detected < 0.01: {'OK' if bad < 0.01 else 'FAIL'})")
    return out


def big_models(size: dict, device: str):
    """The target (Qwen3-30B-A3B's shape, random, a popularity skew in its routers) and a small dense draft."""
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    cfg = Qwen3MoeConfig(vocab_size=size["vocab"], hidden_size=size["hidden"], num_hidden_layers=size["layers"],
                         num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"],
                         head_dim=size["head_dim"], num_experts=size["experts"], num_experts_per_tok=size["top_k"],
                         moe_intermediate_size=size["ffn"], intermediate_size=4 * size["hidden"], norm_topk_prob=True,
                         max_position_embeddings=4096, tie_word_embeddings=False)
    dcfg = Qwen3Config(vocab_size=size["vocab"], hidden_size=size["draft_hidden"],
                       num_hidden_layers=size["draft_layers"],
                       num_attention_heads=8 if size["draft_hidden"] >= 512 else 2, num_key_value_heads=2,
                       head_dim=size["draft_hidden"] // (8 if size["draft_hidden"] >= 512 else 2),
                       intermediate_size=3 * size["draft_hidden"], max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device(device):
        target = AutoModelForCausalLM.from_config(cfg, dtype=size["dtype"]).eval()
        draft = AutoModelForCausalLM.from_config(dcfg, dtype=size["dtype"]).eval()
    with torch.no_grad():  # skew: every token carries a direction u; expert e's router row leans on u by a_e
        u = torch.randn(size["hidden"], device=device)
        u /= u.norm()
        target.model.embed_tokens.weight += 0.5 * u.to(size["dtype"])
        lean = torch.linspace(2.0, -2.0, size["experts"], device=device)
        for layer in target.model.layers:
            gate = layer.mlp.gate.weight
            gate += (lean[torch.randperm(size["experts"], device=device)][:, None] * u).to(gate.dtype)
    return cfg, dcfg, target, draft


def full_size(lines, size: dict, device: str, out_dir: Path) -> dict:
    from moespac.engine.plan import model_shape, plan_memory
    from moespac.engine.session import EngineConfig, EngineSession, host_memory_gib
    from moespac.engine.speculative import Sampling
    from moespac.models.specs import spec_from_config
    from moespac.registry import make_policy
    from moespac.atomic import write_text
    from moespac.bench.calibrate import CalibrationConfig, calibrate
    from moespac.sim.profile import profile_yaml
    from moespac.sim.simulate import SimConfig, simulate

    cfg, dcfg, target, draft = big_models(size, device)
    plan = plan_memory(model_shape(cfg), model_shape(dcfg), device_gib=size["gpu_gib"], host_gib=host_memory_gib(),
                       context=1024, gamma=8, cuda=device.startswith("cuda"))
    log(lines, plan.render())
    spec = spec_from_config(cfg, name="qwen3-30b-a3b-shape (random)").to_dict()
    draft_spec = spec_from_config(dcfg, name="random dense draft").to_dict()
    prompt = list(range(10, 74))
    session = EngineSession(target, draft, None, EngineConfig(target="random", policy=POLICIES[0], copy_mode="async"),
                            plan=plan, device=device)
    results = {}
    try:
        for name in POLICIES:
            session.runtime.reconfigure(session.runtime.config, make_policy(name))
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            session.runtime.phases.clear()
            session.record(spec, meta=dict(batch_size=1, policy=name, gamma=8, draft_spec=draft_spec))
            (res,), stats = session.generate([prompt], gamma=8, max_new_tokens=size["tokens"],
                                             sampling=Sampling(temperature=0.8, seed=0), ignore_eos=True)
            trace = session.finish_trace(trace_id=f"gpu-check-{name}")
            path = out_dir / f"trace-{name}.npz"
            trace.save(path)
            peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
            phases = session.runtime.phase_times()
            results[name] = dict(measured_tokens_per_s=res.tokens_per_second, decode_s=res.decode_s,
                                 draft_s=res.draft_s, target_s=res.target_s, hit_rate=stats["hit_rate"],
                                 slots=stats["capacity"], peak_device_bytes=peak, phases=phases, trace=str(path))
            log(lines, f"{name}: {res.tokens_per_second:.2f} tok/s decode (measured), {len(res.tokens)} tokens, "
                       f"hit rate {stats['hit_rate']:.3f}, {stats['capacity']} slots; phases (host s): "
                       + ", ".join(f"{k} {v:.3f}" for k, v in sorted(phases.items()))
                       + f", draft {res.draft_s:.3f}, target forwards {res.target_s:.3f}")
    finally:
        session.close()
    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    dry = size is DRY  # the sweep at the model's own widths (toy ones in the rehearsal)
    ccfg = CalibrationConfig(hidden=size["hidden"], expert_ffn=size["ffn"], dtype="fp32" if dry else "bf16",
                             repeats=3 if dry else 5, tokens=(1, 2, 4, 8, 16) if dry else CalibrationConfig.tokens)
    profile, raw = calibrate(ccfg, name="this-machine")
    profile_path = out_dir / "this-machine.yaml"
    write_text(profile_path, profile_yaml(profile, raw))
    log(lines, f"calibrated this machine in {time.perf_counter() - t0:.0f} s: {profile_path}")
    for name, r in results.items():
        sim = simulate(SimConfig(trace=r["trace"], policy=name, hardware=str(profile_path), model_spec="trace",
                                 draft_spec=None, cache_ratio=r["slots"] / (size["layers"] * size["experts"]),
                                 bounds=False))
        simulated = sim["metrics"]["tokens_per_s"]
        r["simulated_tokens_per_s"] = simulated
        err = simulated / r["measured_tokens_per_s"] - 1 if r["measured_tokens_per_s"] else float("nan")
        r["simulated_vs_measured"] = err
        verdict = "toy size: not judged" if dry else f"goal within 15 %: {'OK' if abs(err) <= 0.15 else 'MISSED'}"
        log(lines, f"{name}: measured {r['measured_tokens_per_s']:.2f} tok/s, simulated {simulated:.2f} tok/s on the "
                   f"calibrated profile ({err:+.1%}; {verdict})")
    dev_peak = max((r["peak_device_bytes"] or 0) for r in results.values())
    log(lines, f"memory: device peak {dev_peak / 2**30:.2f} GiB (plan {plan.device_total / 2**30:.2f} GiB), host peak "
               f"{host_peak / 2**30:.2f} GiB (plan {plan.host_peak / 2**30:.2f} GiB, plus this process's other state)")
    return dict(plan=dict(slots=plan.slots, cache_ratio=plan.cache_ratio, device_bytes=plan.device_total,
                          host_peak_bytes=plan.host_peak), policies=results, host_peak_bytes=host_peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--dry", action="store_true", help="every step at toy size on the CPU (what CI runs)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.dry else "cuda"
    lines = [f"# command: python benchmarks/gpu_engine_check.py --out {args.out}" + (" --dry" if args.dry else ""),
             f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"]
    t0 = time.perf_counter()
    versions, cannot = check_versions(lines, args.dry)
    summary = dict(versions=versions, failed={}, skipped=cannot)
    if args.dry:
        torch.set_num_threads(1)  # toy models: one thread is fastest and immune to a busy machine
    steps = dict(lossless=lambda: lossless(lines, device, runs=400 if args.dry else 1200),
                 full_size=lambda: full_size(lines, DRY if args.dry else FULL, device, args.out))
    for name, step in steps.items():
        if name in cannot:
            continue
        t = time.perf_counter()
        try:  # a loan is one try: a step that fails says why in one line and the next one still runs
            summary[name] = step()
        except Exception as e:  # noqa: BLE001
            summary["failed"][name] = f"{type(e).__name__}: {e}".splitlines()[0]
            log(lines, f"step {name} FAILED after {time.perf_counter() - t:.0f} s: {summary['failed'][name]}")
        else:
            log(lines, f"step {name}: {time.perf_counter() - t:.0f} s")
        write_outputs(args.out, lines, summary)  # what is measured so far survives a later step's crash
    log(lines, f"done in {time.perf_counter() - t0:.0f} s" + (f"; failed: {', '.join(summary['failed'])}"
                                                              if summary["failed"] else ""))
    write_outputs(args.out, lines, summary)
    if summary["failed"] or cannot:
        sys.exit(1)


def write_outputs(out: Path, lines: list, summary: dict) -> None:
    from moespac.atomic import write_json, write_text

    write_text(out / "gpu_engine_check.log", "\n".join(lines) + "\n")
    write_json(out / "gpu_engine_check.json", summary)


if __name__ == "__main__":
    main()
