# MLflow: one serial step after all runs loads every result record into results/mlflow.db (SQLite). Runs are
# keyed by config hash, so a rerun (or a run interrupted and resumed) updates runs instead of duplicating them.
# Browse with:  mlflow ui --backend-store-uri sqlite:///results/mlflow.db --host 127.0.0.1


localrules:
    log_mlflow,


rule log_mlflow:
    input:
        unpack(get_tracking_inputs),
    output:
        "results/mlflow/ingest.json",
    log:
        "results/logs/log_mlflow/ingest.log",
    conda:
        "../envs/moespac.yaml"
    params:
        studies=get_study_args,
    shell:
        "moespac track ingest {params.studies} --outputs {input.outputs} --summary {output} > {log} 2>&1"
