"""The manifest of a study: content hashes of everything it computes before a clock is read (trained weights,
activation traces, simulated records), with the environment that computed them, and the check of a rerun
against it: "reproduced bit for bit", or which artefacts differ and from which stage on.

A later stage reads the earlier ones (weights -> traces -> cells), so the first stage that differs is where to
look; the environment facts that differ say why (another torch, an unpinned CPU).
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

from moespac.atomic import write_json
from moespac.errors import MoespacError

VERSION = 1
# stage -> the files of results/ it holds, in the order the study computes them
STAGES = {
    "weights": ("models/**/*.safetensors", "models/**/config.json"),
    "traces": ("traces/**/*.npz",),
    "cells": ("simulated/**/*.json", "whatif/*.json"),
}
PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "numba")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_facts() -> dict:
    """What decides the bits besides the code: the software and the kernels the CPU ran."""
    from moespac.environment import software_environment

    sw = software_environment()
    return dict(python=sw["python"], machine=platform.machine(), cpu=cpu_model(), kernels=sw["kernels"],
                **{name: sw["packages"].get(name) for name in PACKAGES if name in sw["packages"]})


def content_hash(path: Path) -> str:
    """sha256 of what a file says: a JSON record without its `environment` block (the commit and package versions
    that wrote it; the manifest keeps those once, apart), any other file byte for byte."""
    data = path.read_bytes()
    if path.suffix == ".json":
        try:
            obj = json.loads(data)
        except ValueError:
            raise MoespacError(f"{path}: not JSON") from None
        if isinstance(obj, dict):
            obj.pop("environment", None)
        data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()


def collect(results: Path) -> dict[str, dict[str, str]]:
    """stage -> {path under results/: content hash}."""
    if not results.is_dir():
        raise MoespacError(f"{results}: no such folder (run the study first)")
    out = {}
    for stage, patterns in STAGES.items():
        files = sorted({p for pattern in patterns for p in results.glob(pattern) if p.is_file()
                        and not p.name.endswith(".failure.json")})
        out[stage] = {p.relative_to(results).as_posix(): content_hash(p) for p in files}
    return out


def write_manifest(results: Path, out: Path, study: str) -> dict:
    stages = collect(results)
    if not any(stages.values()):
        raise MoespacError(f"{results}: no weights, traces or simulated records to list")
    manifest = dict(manifest_version=VERSION, study=study, environment=environment_facts(), stages=stages)
    write_json(out, manifest)
    return manifest


def load_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(Path(path).read_text())
    except OSError as e:
        raise MoespacError(f"manifest {path}: {e.strerror}") from None
    except ValueError:
        raise MoespacError(f"manifest {path}: not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("manifest_version") != VERSION or "stages" not in manifest:
        raise MoespacError(f"manifest {path}: not a moespac manifest (version {VERSION})")
    return manifest


def compare(manifest: dict, results: Path) -> dict:
    """Per stage: the paths that differ, are missing here or are only here; the first stage with a difference;
    and the environment facts that differ."""
    found = collect(results)
    stages = {}
    for stage in STAGES:
        want, got = manifest["stages"].get(stage, {}), found[stage]
        stages[stage] = dict(
            total=len(want), same=sum(1 for p in want if got.get(p) == want[p]),
            differ=sorted(p for p in want if p in got and got[p] != want[p]),
            missing=sorted(p for p in want if p not in got), extra=sorted(p for p in got if p not in want))
    first = next((s for s, r in stages.items() if r["differ"] or r["missing"]), None)
    env, here = manifest.get("environment", {}), environment_facts()
    env_diff = {k: (env.get(k), here.get(k)) for k in sorted(set(env) | set(here)) if env.get(k) != here.get(k)}
    return dict(reproduced=first is None, first_stage=first, stages=stages, environment=env_diff)


def render(report: dict, manifest_path: str) -> str:
    lines = []
    for stage, r in report["stages"].items():
        lines.append(f"{stage}: {r['same']} of {r['total']} identical" +
                     (f", {len(r['differ'])} differ" if r["differ"] else "") +
                     (f", {len(r['missing'])} missing" if r["missing"] else "") +
                     (f" ({len(r['extra'])} not in the manifest)" if r["extra"] else ""))
        for p in (r["differ"] + r["missing"])[:5]:
            lines.append(f"  {'differs' if p in r['differ'] else 'missing'}: {p}")
    if report["reproduced"]:
        lines.append(f"reproduced bit for bit: every artefact of {manifest_path}")
    else:
        lines.append(f"NOT reproduced: the first stage that differs is {report['first_stage']} (later stages read it)")
    for key, (then, now) in report["environment"].items():
        lines.append(f"environment {key}: manifest {then!r}, here {now!r}")
    return "\n".join(lines)
