"""Pin the CPU kernels' instruction set, so that the study's weights, traces and replays are the same bits on
every x86-64 machine with AVX2.

torch, MKL and numpy each pick their code path by the CPU, and an AVX-512 path reduces in another order than
the AVX2 one. Every library reads its switch once, at first use, so `pin()` runs when the `moespac` package is
first imported, before anything imports torch or numpy. MOESPAC_NATIVE_KERNELS=1 leaves the libraries to
choose (faster on AVX-512, not reproducible elsewhere).

Details: docs/internals.md#moespacpinningpy.
"""

from __future__ import annotations

import os
import platform
import sys

# The AVX2 path of each library: present on every x86-64 CPU since 2013-2015 (Haswell, Zen 1).
SWITCHES = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own vectorised kernels (reductions, softmax, norms)
    "MKL_CBWR": "AVX2,STRICT",  # MKL's conditional numerical reproducibility: AVX2 GEMM, fixed reduction order
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (torch's mkldnn ops)
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",  # numpy >= 2.4 dispatch targets above AVX2
}
OPT_OUT = "MOESPAC_NATIVE_KERNELS"

_state: dict = {}


def cpu_has_avx2() -> bool | None:
    """Whether this CPU has AVX2 and FMA (None where /proc/cpuinfo is not there to ask)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return "avx2" in flags and "fma" in flags
    except OSError:
        return None
    return None


def why_not_pinnable() -> str | None:
    """One line saying why this machine cannot give the pinned bits, or None where it can."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"a {machine} CPU runs other kernels than x86-64 AVX2, so weights and traces differ from the manifest's"
    if cpu_has_avx2() is False:
        return "this x86-64 CPU has no AVX2, so torch and numpy take other paths than the manifest's"
    return None


def pin() -> dict:
    """Set the switches (once per process) and return what was done; imported libraries cannot be re-pinned."""
    if _state:
        return _state
    late = sorted(m for m in ("torch", "numpy") if m in sys.modules)
    if os.environ.get(OPT_OUT, "") not in ("", "0"):
        _state.update(pinned=False, reason=f"{OPT_OUT} is set")
    elif (reason := why_not_pinnable()) is not None:
        _state.update(pinned=False, reason=reason)
    else:
        os.environ.update(SWITCHES)
        _state.update(pinned=True, reason=None)
        if late:  # a host program imported them before moespac: their switches were already read
            _state.update(pinned=False, reason=f"{', '.join(late)} imported before moespac; its kernels are not pinned")
    _state["switches"] = {k: os.environ.get(k) for k in SWITCHES}
    return _state


def kernel_facts() -> dict:
    """What the record says about the kernels that computed it: pinned or not (and why), and the path taken."""
    facts = {"pinned": _state.get("pinned", False), "reason": _state.get("reason")}
    if "torch" in sys.modules:
        facts["aten_capability"] = sys.modules["torch"].backends.cpu.get_cpu_capability()
    return facts


def warn_if_unpinned(stream=sys.stderr) -> None:
    """One line at run time where the numbers cannot match another machine's (silent where they can)."""
    if _state and not _state["pinned"] and _state["reason"] != f"{OPT_OUT} is set":
        print(f"moespac: note: kernels not pinned ({_state['reason']}); numbers may differ from other machines",
              file=stream)
