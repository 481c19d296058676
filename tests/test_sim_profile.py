"""Hardware profiles: built-ins load with their sources; bad files fail naming the key and the file."""

import hashlib
from pathlib import Path

import pytest
import yaml

from moespac.errors import MoespacError
from moespac.sim.profile import PROFILE_DIR, HardwareProfile, builtin_profiles, load_profile, profile_yaml

BUILTINS = ["a100-80gb-pcie4", "h200", "rtx4060-8gb", "rtx4090-pcie4"]


def test_builtins_load_with_name_hash_and_a_source_per_number():
    assert builtin_profiles() == BUILTINS
    for name in BUILTINS:
        p = load_profile(name)
        path = PROFILE_DIR / f"{name}.yaml"
        # a built-in is named by its place in the package, the same in every install
        assert p.name == name and p.path == f"moespac/sim/profiles/{name}.yaml"
        assert (PROFILE_DIR.parent.parent.parent / p.path).resolve() == path.resolve()
        assert p.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert set(p.sources) == set(HardwareProfile.parameters()) - HardwareProfile.optional()
        assert p.layer_overhead == p.moe_layer_overhead == p.forward_overhead == 0.0  # hardware only
        assert all(len(src) > 10 for src in p.sources.values())
        assert not p.device_is_host


def test_paper_numbers_in_builtins():
    # links are what a pinned copy achieves (nvbandwidth), the paper's nominal 32 GB/s beside it in the source
    for name, measured in (("rtx4090-pcie4", 26.2e9), ("a100-80gb-pcie4", 25.1e9)):
        p = load_profile(name)
        assert p.link_bandwidth == measured and "measured: NVIDIA nvbandwidth" in p.sources["link_bandwidth"]
        assert "nominal 32 GB/s (paper 4." in p.sources["link_bandwidth"]
    assert load_profile("rtx4060-8gb").link_bandwidth == 26.2e9 / 2  # PCIe 4.0 x8: half the lanes
    assert load_profile("rtx4060-8gb").device_memory == 8 * 2**30
    assert load_profile("h200").device_mem_bandwidth == 4.8e12
    # measured figures where a citable one exists, the nominal value beside it in the source
    h200, a100 = load_profile("h200"), load_profile("a100-80gb-pcie4")
    assert h200.link_bandwidth == 57.06e9 and "nominal 64 GB/s" in h200.sources["link_bandwidth"]
    assert a100.host_mem_bandwidth == 171.5e9 and "nominal 204.8 GB/s" in a100.sources["host_mem_bandwidth"]
    for p in (h200, a100):
        assert p.sources["link_bandwidth"].startswith("measured")
    # every built-in host's memory bandwidth is a measured read figure, never its JEDEC peak (kept in the source)
    for name, measured, nominal in (("a100-80gb-pcie4", 171.5e9, "204.8"), ("h200", 240.6e9, "307.2"),
                                    ("rtx4090-pcie4", 60.8e9, "89.6"), ("rtx4060-8gb", 60.8e9, "89.6")):
        p = load_profile(name)
        assert p.host_mem_bandwidth == measured and p.sources["host_mem_bandwidth"].startswith("measured"), name
        assert f"nominal {nominal} GB/s" in p.sources["host_mem_bandwidth"], name


def write_variant(tmp_path, change) -> Path:
    doc = yaml.safe_load((PROFILE_DIR / "rtx4090-pcie4.yaml").read_text())
    change(doc)
    out = tmp_path / "variant.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("link_bandwidth"), "missing parameter 'link_bandwidth'"),
    (lambda d: d["device_flops"].update(value=0), "'device_flops' must be positive"),
    (lambda d: d["host_mem_bandwidth"].update(value=-1.0), "'host_mem_bandwidth' must be positive"),
    (lambda d: d["link_latency"].update(value="fast"), "'link_latency' = 'fast' is not a number"),
    (lambda d: d["launch_overhead"].pop("source"), "'launch_overhead' has no 'source'"),
    (lambda d: d["device_memory"].update(unit="GB"), "'device_memory' is in 'GB', expected 'B'"),
    (lambda d: d.update(link_bandwith=1), "unknown key 'link_bandwith'"),
    (lambda d: d.update(host_flops=5e12), "'host_flops' must be a mapping"),
    (lambda d: d.update(layer_overhead={"value": -1e-6, "unit": "s", "source": "x"}), "'layer_overhead' must be"),
])
def test_bad_profile_fails_naming_key_and_file(tmp_path, change, message):
    path = write_variant(tmp_path, change)
    with pytest.raises(MoespacError) as e:
        load_profile(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_unknown_name_lists_builtins():
    with pytest.raises(MoespacError, match="rtx4090-pcie4"):
        load_profile("rtx9090")


def test_yaml_round_trip_and_string_exponents(tmp_path):
    p = load_profile("h200")
    out = tmp_path / "copy.yaml"
    out.write_text(profile_yaml(p, {"note": 1}))
    q = load_profile(out)
    assert q == p and q.sources == p.sources and q.sha256 != p.sha256
    # YAML 1.1 reads 6.4e10 (no dot) as a string; the loader still takes it
    path = write_variant(tmp_path, lambda d: d["link_bandwidth"].update(value="6.4e10"))
    assert load_profile(path).link_bandwidth == 6.4e10


def test_engine_overheads_are_optional_and_may_be_zero(tmp_path):
    path = write_variant(tmp_path, lambda d: d.update(layer_overhead={"value": 0, "unit": "s", "source": "none"},
                                                      forward_overhead={"value": 1e-4, "unit": "s", "source": "m"}))
    p = load_profile(path)
    assert (p.layer_overhead, p.moe_layer_overhead, p.forward_overhead) == (0.0, 0.0, 1e-4)
