"""The paper's own numbers as DataFrames keyed like our rows (canonical benchmark names, paper row labels)."""

from __future__ import annotations

import re

import pandas as pd

from moespac.datasets import get_benchmark
from moespac.reference import read_reference

# Table 3's model column -> our model-spec names
TABLE3_MODELS = {"DeepSeek-V2-Lite (16B)": "deepseek-v2-lite", "GLM-4.5-Air (106B)": "glm-4.5-air",
                 "Qwen3.5 (122B)": "qwen3.5-122b-a10b", "MiniMax-M2.5 (228B)": "minimax-m2.5"}
# Table 3's hardware column -> our hardware profiles
TABLE3_HARDWARE = {"RTX 4090": "rtx4090-pcie4", "A100-80GB": "a100-80gb-pcie4"}


# where the paper's numbers were measured (its Section 4.1 and Table 3): a reader must not read them as this
# machine's or this model's
SETTING = "RTX 4090 + PCIe 4.0, Qwen3-30B-A3B with a Qwen3-4B-FP8 draft"
SETUP = f"the paper's own run ({SETTING})"
TABLE3_SETUP = "the paper's own runs: each row's GPU (RTX 4090 or A100-80GB) and model, drafted by quantized variants"


def squash(label: str) -> str:
    """'llama.cpp (w/ SD)' and 'llama.cpp-w/ SD' compare equal."""
    return re.sub(r"[^a-z0-9]", "", label.lower())


def _bench(name: str) -> str:
    return "average" if name.lower() == "average" else get_benchmark(name).name


def _frame(name: str, numeric: list[str]) -> pd.DataFrame:
    df = pd.DataFrame(read_reference(name))
    for col in numeric:
        df[col] = df[col].astype(float)
    if "benchmark" in df:
        df["benchmark"] = df["benchmark"].map(_bench)
    return df


def table1() -> pd.DataFrame:
    """method (paper label), benchmark (canonical or 'average'), tps, latency_s."""
    return _frame("table1_overall", ["tps", "latency_s"])


def table2() -> pd.DataFrame:
    return _frame("table2_ablation", ["tps", "latency_s"]).rename(columns={"variant": "method"})


def table3() -> pd.DataFrame:
    df = _frame("table3_models", ["tps"])
    df["spec"] = df["model"].map(TABLE3_MODELS)
    df["profile"] = df["hardware"].map(TABLE3_HARDWARE)
    return df


def table4() -> pd.DataFrame:
    df = _frame("table4_batch_gamma", ["tps"])
    df["batch_size"] = df["batch_size"].astype(int)
    df["gamma"] = df["gamma"].astype(int)
    return df


def table6() -> pd.DataFrame:
    return _frame("table6_numerics", ["worst_nmse"])


def appendix() -> pd.DataFrame:
    """quantity, benchmark (canonical), value for the Appendix A.1 rows (alpha, a/b, TPS) by benchmark."""
    rows = [r for r in read_reference("appendix_stats")
            if r["quantity"] in ("acceptance_rate", "expert_cost_ratio_a_over_b", "tps", "gpu_cache_hit_rate")]
    df = pd.DataFrame(rows)
    df["benchmark"] = df["context"].map(_bench)
    df["value"] = df["value"].astype(float)
    return df[["quantity", "benchmark", "value", "source"]]


def lookup(df: pd.DataFrame, value: str, **keys):
    """The one value of `df` matching keys (labels compared squashed), else None."""
    mask = pd.Series(True, index=df.index)
    for k, v in keys.items():
        col = df[k]
        mask &= (col.astype(str).map(squash) == squash(v)) if isinstance(v, str) else (col == v)
    hit = df.loc[mask, value]
    return float(hit.iloc[0]) if len(hit) else None
