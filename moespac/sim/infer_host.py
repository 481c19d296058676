"""The paper's unstated host, inferred from its own baseline rows: the host memory bandwidth at which this
simulator's llama.cpp (no SD) row gives the paper's llama.cpp tokens/s on paper-regime routing.

llama.cpp is the baseline whose mechanism the simulator prices most directly (a static split: the first layers'
experts read from host memory by the CPU every token, the rest resident), and on the paper's hardware its decode
time is almost all those host reads, so its row pins the host's bandwidth. The fit reads only the paper's
llama.cpp rows (`PAPER_ROWS`); MoE-SpAc's and every other method's numbers are predictions under the result,
never an input. One bandwidth per benchmark (bisection: tokens/s rises with the bandwidth); the study uses
their geometric mean and shows their range. The profile it writes is its own, marked inferred; a sourced
profile is never changed.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from moespac.errors import MoespacError
from moespac.parallel import pmap
from moespac.sim.profile import HardwareProfile, load_profile, profile_yaml
from moespac.sim.simulate import SimConfig, simulate
from moespac.trace import Trace

PAPER_ROWS = ("llama.cpp",)
"""The paper's Table 1 rows the host fit reads (its `method` column), and no other."""
SD_ROWS = ("llama.cpp", "llama.cpp-w/ SD")
"""The rows the a/b check reads: llama.cpp's SD gain, never MoE-SpAc's or another method's numbers."""
FIT_POLICY = "llamacpp"
"""The policy those rows are replayed through (the catalogue's Table 1 'llama.cpp' row)."""
RANGE = (5e9, 1e12)
"""Host bandwidths searched, B/s: below a single DDR4 channel to above an 8-channel DDR5 server."""


def paper_tps(method: str = "llama.cpp") -> dict[str, float]:
    """{benchmark: tokens/s} of one of the rows this module may read (PAPER_ROWS, SD_ROWS), averages left out."""
    from moespac.datasets import get_benchmark
    from moespac.reference import read_reference

    if method not in PAPER_ROWS + SD_ROWS:
        raise MoespacError(f"the host inference reads only {', '.join(dict.fromkeys(PAPER_ROWS + SD_ROWS))}, "
                           f"not {method!r}")
    return {get_benchmark(r["benchmark"]).name: float(r["tps"]) for r in read_reference("table1_overall")
            if r["method"] == method and r["benchmark"].lower() != "average"}



ACHIEVABLE_READ = 60.8 / 96.0
"""Read bandwidth reached / JEDEC peak on the one host whose figure the sourced profile cites (a Zen 4 desktop,
dual-channel DDR5-6000: 60.8 of 96 GB/s); applied to the nominal peaks below, an assumption said as such."""

PLAUSIBLE = {
    "host_mem_bandwidth": (
        ("dual-channel DDR4-3200 desktop", 51.2e9 * ACHIEVABLE_READ),
        ("dual-channel DDR5-5600 desktop", 89.6e9 * ACHIEVABLE_READ),
        ("8-channel DDR4-3200 server", 204.8e9 * ACHIEVABLE_READ),
        ("12-channel DDR5-4800 server", 460.8e9 * ACHIEVABLE_READ),
    ),
    "host_flops": (  # cores x 32 FP32 FLOP/cycle (two 256-bit FMA pipes) x base clock
        ("8-core desktop, 4.0 GHz", 8 * 32 * 4.0e9),
        ("64-core server, 2.45 GHz", 64 * 32 * 2.45e9),
    ),
    "link_bandwidth": (
        ("PCIe 4.0 x16, slowest measured card", 23.9e9),
        ("PCIe 4.0 x16 at the paper's 32 GB/s", 32e9),
    ),
}
"""The physically plausible range of each host parameter the paper leaves open, as named points (nominal
memory peaks x ACHIEVABLE_READ; FLOP/s from core counts and clocks; the link: the nvbandwidth spread the sourced
profile cites, and the paper's own nominal figure). The sweep moves one parameter at a time from the inferred host."""


def with_parameter(profile: HardwareProfile, field: str, value: float, source: str, name: str | None = None):
    """`profile` with one parameter replaced (and said where it came from)."""
    return dataclasses.replace(profile, name=name or profile.name, **{field: float(value)},
                               sources=dict(profile.sources, **{field: source}))


def with_host_bandwidth(profile: HardwareProfile, bandwidth: float, source: str, name: str | None = None):
    """`profile` with its host memory bandwidth replaced (and said where it came from)."""
    return with_parameter(profile, "host_mem_bandwidth", bandwidth, source, name)


def llamacpp_tps(profile_path: str, trace: Trace, cache_ratio: float, draft_spec: str,
                 policy: str = FIT_POLICY) -> float:
    cfg = SimConfig(trace=trace.trace_id(), policy=policy, hardware=profile_path, model_spec="trace",
                    draft_spec=draft_spec, cache_ratio=cache_ratio, bounds=False, warmup_steps=0)
    return float(simulate(cfg, trace=trace)["metrics"]["tokens_per_s"])


def fit_bandwidth(base: HardwareProfile, trace: Trace, target_tps: float, cache_ratio: float, draft_spec: str,
                  workdir, steps: int = 16, tag: str = "") -> float:
    """Host bandwidth (B/s) in RANGE at which llama.cpp on `trace` runs at `target_tps`; a target outside what
    RANGE can give is refused, naming it. tag: names this fit's profile file (fits run side by side)."""
    path = Path(workdir) / f"{base.name}-fit{tag}.yaml"

    def tps(bw: float) -> float:
        path.write_text(profile_yaml(with_host_bandwidth(base, bw, "fit in progress")))
        return llamacpp_tps(str(path), trace, cache_ratio, draft_spec)

    lo, hi = RANGE
    t_lo, t_hi = tps(lo), tps(hi)
    if not t_lo <= target_tps <= t_hi:
        raise MoespacError(f"llama.cpp at {target_tps} tokens/s is outside what host bandwidths of "
                           f"{lo / 1e9:g}-{hi / 1e9:g} GB/s give on {base.name} ({t_lo:.2f}-{t_hi:.2f})")
    for _ in range(steps):  # geometric bisection: about 0.3 % in bandwidth after 16 steps
        mid = math.sqrt(lo * hi)
        if tps(mid) < target_tps:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def infer_host(base_name: str, ar_traces: dict[str, Trace], cache_ratio: float, draft_spec: str, workdir,
               jobs: int = 1) -> dict:
    """Fit the host bandwidth per benchmark to the paper's llama.cpp row; returns the per-benchmark values, their
    geometric mean and range, and the inferred profile (a HardwareProfile named '<base>-paper-inferred'). jobs:
    processes the benchmarks' fits are spread over."""
    base = load_profile(base_name)
    targets = paper_tps(PAPER_ROWS[0])
    missing = sorted(set(ar_traces) - set(targets))
    if missing:
        raise MoespacError(f"the paper has no llama.cpp row for benchmark {missing[0]!r}: nothing to fit there")
    fit = lambda b: fit_bandwidth(base, ar_traces[b], targets[b], cache_ratio, draft_spec, workdir, tag=f"-{b}")
    per = dict(zip(ar_traces, pmap(fit, list(ar_traces), jobs)))
    values = np.array(list(per.values()))
    mean = float(np.exp(np.log(values).mean()))
    source = (f"inferred, not measured: the host bandwidth at which this simulator's llama.cpp row gives the "
              f"paper's llama.cpp tokens/s (Table 1) on paper-regime routing; geometric mean of one fit per "
              f"benchmark, range {values.min() / 1e9:.1f}-{values.max() / 1e9:.1f} GB/s (base profile {base.name}: "
              f"{base.host_mem_bandwidth / 1e9:.1f} GB/s, {base.sources.get('host_mem_bandwidth', '')[:60]}...)")
    profile = dataclasses.replace(
        with_host_bandwidth(base, mean, source, name=f"{base.name}-paper-inferred"),
        notes=f"{base.name} with its host memory bandwidth inferred from the paper's llama.cpp rows; every other "
              f"parameter is {base.name}'s. Not a measured machine.")
    return dict(per_benchmark=per, value=mean, low=float(values.min()), high=float(values.max()),
                base=base.name, base_value=base.host_mem_bandwidth, targets={b: targets[b] for b in ar_traces},
                reads=list(PAPER_ROWS), profile=profile)


def ab_from_sd_gain(spec, params: dict, profile_path: str, cache_ratio: float, draft_spec: str, shape, seed: int = 0,
                    steps: int = 10, jobs: int = 1) -> dict[str, dict]:
    """Do the paper's tables agree with each other? Per benchmark with App. A.1 statistics (`params`: its fitted
    RoutingParams, alpha already A.1's): the token spread at which llama.cpp's SD gain on this host equals the
    paper's (llama.cpp-w/ SD over llama.cpp, Table 1), and the a/b that spread gives, beside A.1's. A gain no
    spread reaches is said with the a/b range searched. Reads only SD_ROWS."""
    from moespac.sim import paper_routing as pr

    plain, sd = paper_tps(SD_ROWS[0]), paper_tps(SD_ROWS[1])

    def one(bench: str) -> dict:
        p, target = params[bench], sd[bench] / plain[bench]

        def gain(temperature: float) -> tuple[float, float]:
            q = dataclasses.replace(p, temperature=temperature)
            # one draw for both traces, without the self-draft signal: llama.cpp does not read it
            drawn = pr.Sequences(spec, q, shape, seed=seed, self_draft=False)
            spec_trace = pr.paper_regime_trace(spec, q, shape, seed=seed, benchmark=bench, self_draft=False,
                                               sequences=drawn)
            ar_trace = pr.paper_regime_trace(spec, q, shape, seed=seed, benchmark=bench, ar=True, self_draft=False,
                                             sequences=drawn)
            g = (llamacpp_tps(profile_path, spec_trace, cache_ratio, draft_spec, "llamacpp-sd")
                 / llamacpp_tps(profile_path, ar_trace, cache_ratio, draft_spec))
            return g, pr.measured_statistics(spec_trace)["a_over_b"]

        lo, hi = pr.T_RANGE
        (g_lo, ab_lo), (g_hi, ab_hi) = gain(lo), gain(hi)  # the gain falls as the spread (a/b) grows
        row = dict(paper_gain=target, reachable=(g_hi, g_lo), ab_range=(ab_lo, ab_hi))
        if not g_hi <= target <= g_lo:
            return dict(row, a_over_b=None)
        for _ in range(steps):
            mid = math.sqrt(lo * hi)
            if gain(mid)[0] > target:
                lo = mid
            else:
                hi = mid
        g, ab = gain(math.sqrt(lo * hi))
        return dict(row, a_over_b=ab, gain=g)

    return dict(zip(params, pmap(one, list(params), jobs)))
