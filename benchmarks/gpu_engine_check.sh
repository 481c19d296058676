#!/usr/bin/env bash
# Prepared device check for the engine's CUDA paths (pinned host experts, copy stream + events, async
# prefetch worker, device/host overlap). Run on a CUDA machine from the repo root:
#     bash benchmarks/gpu_engine_check.sh OUTDIR
# Writes OUTDIR/gpu_engine_check.log; commit it under results/gpu/ with this command line.
set -uo pipefail
out=${1:-results/gpu}
mkdir -p "$out"
log="$out/gpu_engine_check.log"
{
  echo "# command: bash benchmarks/gpu_engine_check.sh $out"
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  d=$(mktemp -d)
  moespac make-micro --out "$d/micro" --arch qwen3_moe
  moespac make-micro --out "$d/micro-ds" --arch deepseek_v2
  for m in micro micro-ds; do
    moespac check-lossless --target "$d/$m/target" --draft "$d/$m/draft" --device cuda --prompts 20 \
      --gammas 1,4,8 --cache-ratios 0,0.5,1
    for mode in async sync; do
      moespac generate --target "$d/$m/target" --draft "$d/$m/draft" --device cuda --policy lru --copy-mode $mode \
        --cache-ratio 0.5 --prompt "Explain speculative decoding." --max-new-tokens 128 --greedy --json "$d/$m-$mode.json"
    done
  done
  python benchmarks/hybrid_overhead.py
} 2>&1 | tee "$log"
