"""Hardware profiles: the numbers the cost model turns into seconds, each with its source.

A profile is a YAML file. Every parameter is a mapping `{value: <number>, unit: <unit>, source: <text>}`
so the origin of each number sits beside it; `name:` and `notes:` are free text. Built-in profiles live
in moespac/sim/profiles/; `moespac calibrate` writes new ones.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from moespac.errors import MoespacError

PROFILE_DIR = Path(__file__).with_name("profiles")


def _param(unit: str):
    return field(metadata={"unit": unit})


def _optional_param(unit: str):
    # A hardware figure a profile may leave out (0 = not modelled)
    return field(default=0.0, metadata={"unit": unit, "optional": True})


def _engine_param():
    # Software overheads of our eager PyTorch engine: optional (0 = none), measured by `calibrate`
    return field(default=0.0, metadata={"unit": "s", "optional": True})


@dataclass(frozen=True)
class HardwareProfile:
    """One machine: a device (GPU) with its memory, a host (CPU) with its memory, and the link between."""

    name: str
    """Profile name (built-ins: the file stem)."""
    link_bandwidth: float = _param("B/s")
    """Host -> device copy bandwidth for expert weights (pinned host memory)."""
    link_latency: float = _param("s")
    """Fixed cost of one host -> device copy (issue + completion)."""
    device_mem_bandwidth: float = _param("B/s")
    """Device memory bandwidth (streaming weights and KV through the device kernels)."""
    device_flops: float = _param("FLOP/s")
    """Peak dense bf16 matrix throughput of the device."""
    device_memory: float = _param("B")
    """Device memory capacity."""
    launch_overhead: float = _param("s")
    """Cost of one device kernel launch (added per kernel on top of its bandwidth/compute time)."""
    host_mem_bandwidth: float = _param("B/s")
    """Host memory bandwidth available to the expert kernels on all cores."""
    host_flops: float = _param("FLOP/s")
    """Peak matrix throughput of the host cores at the experts' dtype."""
    host_op_overhead: float = _param("s")
    """Cost of dispatching one host operator (framework + thread-pool wake-up)."""
    host_cache_bytes: float = _optional_param("B")
    """Optional: the host's last-level cache. A model pair whose weights fit in it is read from it every step
    (at host_cache_bandwidth), not from memory; 0 = not modelled (the built-ins' models are far larger)."""
    host_cache_bandwidth: float = _optional_param("B/s")
    """Optional: read bandwidth of expert kernels whose weights sit in the last-level cache."""
    layer_overhead: float = _engine_param()
    """Optional, engine software: framework time of one decoder layer beyond its kernels (eager PyTorch
    module calls, KV-cache update). 0 in the built-ins, which model the hardware, not our engine."""
    moe_layer_overhead: float = _engine_param()
    """Optional, engine software: extra time of one MoE layer in the hybrid runtime (routing counts,
    policy calls, dispatch and merge of expert outputs)."""
    forward_overhead: float = _engine_param()
    """Optional, engine software: fixed time of one model forward (embedding, cache bookkeeping, logits)."""
    device_call_overhead: float = _engine_param()
    """Optional, engine software: extra time of a layer's device expert call beyond its kernels (slot events,
    pool bookkeeping); charged when any expert of the layer runs on the device."""
    host_call_overhead: float = _engine_param()
    """Optional, engine software: extra time of a layer's host expert call beyond its kernels (staging its
    rows, the wait for them, the copy back); charged when any expert of the layer runs on the host."""
    draft_token_overhead: float = _engine_param()
    """Optional, engine software: sampling one drafted token beyond the draft's forward (probabilities, the
    draw, reading its id back)."""
    step_overhead: float = _engine_param()
    """Optional, engine software: one decode step's loop beyond its forwards (acceptance, KV rollback, the
    runtime's step hooks)."""
    copy_overhead: float = _engine_param()
    """Optional, engine software: time of issuing one expert copy beyond the link's (slot reservation, the
    store's copy call, its events); every copy, prefetch or on-demand, pays it."""
    device_is_host: bool = False
    """True when the "device" is the host CPU itself (calibrated on a CPU-only machine): device and host
    expert work then run one after the other on the same cores, and hidden states need no transfer."""
    notes: str = ""
    """Free-text remarks (what was assumed, how it was measured)."""
    sources: dict = field(default_factory=dict, compare=False)
    """Parameter -> where its number comes from."""
    path: str = field(default="", compare=False)
    """File the profile was read from."""
    sha256: str = field(default="", compare=False)
    """sha256 of that file's bytes (goes into every simulated record)."""

    @classmethod
    def parameters(cls) -> dict[str, str]:
        """Numeric parameter -> unit."""
        return {f.name: f.metadata["unit"] for f in fields(cls) if "unit" in f.metadata}

    @classmethod
    def optional(cls) -> set[str]:
        """Parameters that may be left out (then 0) or be 0."""
        return {f.name for f in fields(cls) if f.metadata.get("optional")}

    def to_yaml_dict(self) -> dict:
        """The on-disk form (what `load_profile` reads back)."""
        out = {"name": self.name}
        for key, unit in self.parameters().items():
            if key in self.optional() and key not in self.sources and not getattr(self, key):
                continue
            out[key] = {"value": float(getattr(self, key)), "unit": unit, "source": self.sources.get(key, "")}
        out["device_is_host"] = self.device_is_host
        if self.notes:
            out["notes"] = self.notes
        return out


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """A built-in name (`rtx4090-pcie4`) or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise MoespacError(f"hardware profile {p}: no such file")
        if not p.is_file():
            raise MoespacError(f"hardware profile {p}: is a folder; give a YAML file or a built-in name")
        return p
    builtin = PROFILE_DIR / f"{name_or_path}.yaml"
    if not builtin.exists():
        raise MoespacError(f"unknown hardware profile {str(name_or_path)!r}; built-ins: {', '.join(builtin_profiles())}"
                           " (or give a YAML path)")
    return builtin


def _shown(path: Path) -> str:
    """How a record names the profile file: a built-in by its place in the package (the same in every
    install, so records do not depend on where moespac lives), any other file as given."""
    if path.resolve().parent == PROFILE_DIR.resolve():
        return f"moespac/sim/profiles/{path.name}"
    return str(path)


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """Read and validate a profile; a missing or non-positive parameter fails naming the key and file."""
    path = resolve_profile_path(name_or_path)
    raw = path.read_bytes()
    where = f"hardware profile {path}"
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise MoespacError(f"{where}: not valid YAML{at} ({problem})") from None
    if not isinstance(doc, dict):
        raise MoespacError(f"{where}: expected a mapping of parameters")
    params, optional = HardwareProfile.parameters(), HardwareProfile.optional()
    allowed = set(params) | {"name", "notes", "device_is_host", "measurements"}
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise MoespacError(f"{where}: unknown key {unknown[0]!r}")
    values, sources = {}, {}
    for key, unit in params.items():
        if key not in doc and key in optional:
            continue
        if key not in doc:
            raise MoespacError(f"{where}: missing parameter {key!r} ({unit})")
        entry = doc[key]
        if not isinstance(entry, dict) or "value" not in entry:
            raise MoespacError(f"{where}: parameter {key!r} must be a mapping with 'value', 'unit' and 'source'")
        if not str(entry.get("source") or "").strip():
            raise MoespacError(f"{where}: parameter {key!r} has no 'source' note")
        if entry.get("unit", unit) != unit:
            raise MoespacError(f"{where}: parameter {key!r} is in {entry['unit']!r}, expected {unit!r}")
        try:
            value = float(entry["value"])  # YAML 1.1 reads "3.2e10" (no dot) as a string
        except (TypeError, ValueError):
            raise MoespacError(f"{where}: parameter {key!r} = {entry['value']!r} is not a number") from None
        if key in optional and value == 0:
            pass
        elif not value > 0 or value == float("inf"):
            raise MoespacError(f"{where}: parameter {key!r} must be positive and finite, got {entry['value']!r}")
        values[key], sources[key] = value, str(entry["source"]).strip()
    device_is_host = doc.get("device_is_host", False)
    if not isinstance(device_is_host, bool):
        raise MoespacError(f"{where}: 'device_is_host' must be true or false, got {device_is_host!r}")
    return HardwareProfile(name=str(doc.get("name") or path.stem), device_is_host=device_is_host,
                           notes=str(doc.get("notes") or "").strip(), sources=sources, path=_shown(path),
                           sha256=hashlib.sha256(raw).hexdigest(), **values)


def profile_yaml(profile: HardwareProfile, measurements: dict | None = None) -> str:
    """YAML text for `profile` (plus raw measurements, kept for the record and ignored by the loader)."""
    doc = profile.to_yaml_dict()
    if measurements:
        doc["measurements"] = measurements
    return yaml.safe_dump(doc, sort_keys=False, width=110)
