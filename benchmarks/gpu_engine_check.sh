#!/usr/bin/env bash
# The prepared device check (benchmarks/gpu_engine_check.py), for a GPU machine lent for 15 minutes:
#     bash benchmarks/gpu_engine_check.sh results/gpu          # the real check, <= 8 minutes on an H200
#     bash benchmarks/gpu_engine_check.sh /tmp/dry --dry       # every step at toy size on a CPU (CI runs this)
# Writes OUTDIR/gpu_engine_check.log and .json; commit them under results/gpu/ with this command line.
set -euo pipefail
out=${1:-results/gpu}
shift || true
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"; } \
  > "$out/nvidia-smi.txt"
exec python benchmarks/gpu_engine_check.py --out "$out" "$@"
