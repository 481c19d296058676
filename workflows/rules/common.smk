from snakemake.utils import validate


validate(config, schema="../schemas/config.schema.yaml")


def get_final_output():
    archs = config["smoke"]["archs"]
    return (
        expand("results/smoke/lossless/{arch}.txt", arch=archs)
        + expand("results/smoke/generate/{arch}.json", arch=archs)
        + ["results/smoke/numerics.json"]
    )


wildcard_constraints:
    arch="|".join(config["smoke"]["archs"]),
