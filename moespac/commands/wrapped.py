"""`moespac wrapped SYSTEM`: run an external system as its authors ship it; writes a record with timing 'wrapped'."""

from __future__ import annotations

from moespac.iopaths import IO

HELP = {
    "llamacpp": "llama.cpp built from the PyPI sdist: plain or speculative decoding, experts on the host",
    "accelerate": "transformers device_map='auto' with max_memory limits (HF Accelerate offload)",
    "vllm": "vLLM with --cpu-offload-gb (CUDA only; a skip record elsewhere)",
    "moespac-release": "the authors' MoE-SpAc llama.cpp fork (CUDA + network; a skip record elsewhere)",
}


def register(sub) -> None:
    from baselines.programs import SYSTEMS, system_module
    from baselines.programs.llamacpp import add_build_arguments, main_build

    p = sub.add_parser("wrapped", help="run an external system (llama.cpp, Accelerate, vLLM, the MoE-SpAc release)")
    systems = p.add_subparsers(dest="system", required=True, metavar="SYSTEM")
    for name in SYSTEMS:
        mod = system_module(name)
        sp = systems.add_parser(name, help=HELP[name], description=HELP[name])
        mod.add_arguments(sp)
        sp.set_defaults(func=mod.main)
    bp = systems.add_parser("build-llamacpp", help="build llama.cpp once (the pipeline's cacheable step)")
    add_build_arguments(bp)
    bp.add_argument("--json", default=None, help="also write the build description here")
    bp.set_defaults(func=main_build, io=IO(outputs=("json",)))
