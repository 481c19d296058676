"""The CPU kernels are pinned to one instruction set (moespac/pinning.py): another machine's vector width, emulated
here with the libraries' own switches, no longer changes what the study computes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moespac.hashing import model_id
from moespac.pinning import why_not_pinnable

# what another x86-64 machine would pick by itself: no vectors (an old CPU), MKL's AVX-512 GEMM (an Intel
# server), numpy's AVX-512 loops
EMULATE_ANOTHER_MACHINE = dict(ATEN_CPU_CAPABILITY="default", MKL_ENABLE_INSTRUCTIONS="AVX512",
                               NPY_DISABLE_CPU_FEATURES="")


def build_tiny(out: Path, **env) -> tuple[str, str]:
    run_env = {k: v for k, v in os.environ.items() if k not in ("MOESPAC_NATIVE_KERNELS", *EMULATE_ANOTHER_MACHINE)}
    r = subprocess.run([sys.executable, "-m", "moespac", "build-proxy", "--config", "tiny", "--out", str(out)],
                       env=dict(run_env, HF_HUB_OFFLINE="1", **env), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return tuple(model_id(str(out / sub)).split("@")[1] for sub in ("target", "draft"))


@pytest.mark.skipif(why_not_pinnable() is not None,
                    reason="pinning needs x86-64 with AVX2 (this CPU: see why_not_pinnable)")
def test_another_machines_kernels_give_the_same_weights(tmp_path):
    here = build_tiny(tmp_path / "here")
    elsewhere = build_tiny(tmp_path / "elsewhere", **EMULATE_ANOTHER_MACHINE)
    assert here == elsewhere
    # negative control: the same switches with the pinning off change the weights, so the test above can fail
    unpinned = build_tiny(tmp_path / "unpinned", MOESPAC_NATIVE_KERNELS="1", **EMULATE_ANOTHER_MACHINE)
    assert unpinned != here


def test_a_record_says_whether_its_kernels_were_pinned():
    from moespac.environment import software_environment

    kernels = software_environment()["kernels"]
    assert kernels["pinned"] is (why_not_pinnable() is None) and (kernels["reason"] is None) is kernels["pinned"]
