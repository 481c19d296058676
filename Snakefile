# moespac workflow: `snakemake --cores all` reruns the configured study end to end: builds the models and
# llama.cpp, runs the seven benchmarks (measured, simulated, wrapped), the ablations and sweeps, regenerates
# every table and figure into paper_figs/ and loads every result record into MLflow (results/mlflow.db).
# The default config runs on a CPU; `--configfile workflows/config/paper.yaml` is the paper's protocol on a GPU.
from snakemake.utils import min_version

min_version("9.0")


# the embedded default; `--configfile X` is merged over it (mappings merge, lists and values replace)
configfile: f"{workflow.current_basedir}/workflows/config/default.yaml"  # this file's folder, also when included


report: "workflows/report/workflow.rst"


include: "workflows/rules/common.smk"
include: "workflows/rules/build.smk"
include: "workflows/rules/smoke.smk"
include: "workflows/rules/bench.smk"
include: "workflows/rules/tables.smk"
include: "workflows/rules/figures.smk"
include: "workflows/rules/tracking.smk"


rule all:
    default_target: True
    input:
        get_final_output(),
