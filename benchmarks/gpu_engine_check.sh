#!/usr/bin/env bash
# The prepared device check (benchmarks/gpu_engine_check.py) for a GPU machine lent for 15 minutes, with no
# internet and nothing installed: it runs from this working tree on the machine's own python3 and packages
# (torch >= 2.6 with CUDA, transformers 5.7-5.x, tokenizers, safetensors, numpy, numba, pyyaml, tqdm; no mlflow,
# no snakemake, no `pip install`):
#     bash benchmarks/gpu_engine_check.sh results/gpu          # the real check
#     bash benchmarks/gpu_engine_check.sh /tmp/dry --dry       # every step at toy size on a CPU (CI runs this)
# Through the device tool: `bash benchmarks/gpu_engine_check.sh "$OUT"` with timeout_s 480, then commit what comes
# back under results/gpu/ (gpu_engine_check.log and .json, nvidia-smi.txt, this-machine.yaml; not the traces).
# Full size, estimated from the plan (Qwen3-30B-A3B's shape, 30.5 G parameters, bf16, 57 GiB of experts):
#   1. versions: < 1 s (imports 10-20 s)
#   2. lossless: float64 micro models, 2 architectures x 18 greedy sequences of 16 tokens + 2 x 1200 sampled runs:
#      about 1-2 min (launch-bound: tens of kernels per token)
#   3. full size: building the random target on the GPU and its 57 GiB expert store on the host (1-2 min, host
#      copies at 5-10 GB/s), 2 policies x 512 tokens (1-3 min), calibration (about 1 min), two simulations (s)
# about 4-7 minutes in all; each step prints its own time, and a failed step says why in one line, the next runs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-results/gpu}
shift || true
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"; } \
  > "$out/nvidia-smi.txt"
# the package from this tree, not an installed copy (there is none on a lent machine)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
python=$(command -v python3 || command -v python)
exec "$python" "$repo/benchmarks/gpu_engine_check.py" --out "$out" "$@"
