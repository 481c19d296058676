# moespac workflow: `snakemake --cores all` rebuilds every output of the configured study.
# The full paper pipeline (benchmarks, sweeps, tables, figures, MLflow) grows here rule file by rule file;
# today it runs the engine smoke study: micro pairs, the lossless check, Table 6 numerics and a traced run.
from snakemake.utils import min_version

min_version("9.0")


configfile: "workflows/config/default.yaml"


include: "workflows/rules/common.smk"
include: "workflows/rules/smoke.smk"


rule all:
    default_target: True
    input:
        get_final_output(),
