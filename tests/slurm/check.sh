#!/usr/bin/env bash
# The tiny workflow study through Slurm (profiles/slurm and the Snakemake Slurm executor plugin) and locally,
# then the same comparison as tests/test_workflow.py's determinism test: traces, simulated records and figures
# byte for byte, the simulated rows of every table equal. Needs a running Slurm (tests/slurm/start.sh) and
#   pip install snakemake-executor-plugin-slurm
# Usage: bash tests/slurm/check.sh OUT_DIR
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
tiny=$repo/tests/fixtures/workflow_tiny.yaml
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
sinfo
rm -rf "$out/local" "$out/slurm"
mkdir -p "$out/local" "$out/slurm"
t0=$(date +%s)
(cd "$out/local" && snakemake -s "$repo/workflow/Snakefile" --workflow-profile "$repo/profiles/default" --cores 2 --configfile "$tiny" > "$out/local.log" 2>&1)
t1=$(date +%s)
# squeue for job status: a single-node Slurm has no accounting database for sacct
(cd "$out/slurm" && snakemake -s "$repo/workflow/Snakefile" --workflow-profile "$repo/profiles/default" --profile "$repo/profiles/slurm" --configfile "$tiny" \
    --slurm-status-command squeue --slurm-no-account --slurm-init-seconds-before-status-checks 5 \
    > "$out/slurm.log" 2>&1)
t2=$(date +%s)
echo "local run $((t1 - t0)) s; Slurm run $((t2 - t1)) s, $(grep -c 'Job .* has been submitted with SLURM jobid' "$out/slurm.log") jobs submitted to Slurm"
python - "$repo/tests" "$out/local" "$out/slurm" <<'PY'
import sys
from pathlib import Path

sys.path.insert(0, sys.argv.pop(1))
from test_workflow import _simulated_rows  # the determinism test's own comparison

a, b = Path(sys.argv[1]), Path(sys.argv[2])
def files(root, pattern):
    return sorted(p.relative_to(root).as_posix() for p in root.glob(pattern))
names = files(a, "results/traces/**/*.npz") + files(a, "results/simulated/**/*.json") + files(a, "results/whatif/*.json")
names += [f for f in files(a, "paper_figs/*.p[dn][gf]") if not f.startswith("paper_figs/fig_overhead")]
assert names and files(b, "results/simulated/**/*.json") == files(a, "results/simulated/**/*.json")
differ = [n for n in names if (a / n).read_bytes() != (b / n).read_bytes()]
csvs = files(a, "paper_figs/*.csv")
rows = [n for n in csvs if _simulated_rows(a / n) != _simulated_rows(b / n)]
print(f"{len(names)} traces, simulated records and figures: {len(differ)} differ; {len(csvs)} tables: "
      f"{len(rows)} with different simulated rows")
sys.exit(1 if differ or rows else 0)
PY
