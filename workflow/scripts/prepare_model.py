from llmgeom.pipeline.jobs import run_logged
from llmgeom.models.sources import prepare_model

with run_logged(snakemake.log[0]):
    spec = snakemake.params.spec
    if spec["source"] == "random_init":  # a random-init twin: the null model of its trained model
        from llmgeom.models.random_init import prepare_random_init

        prepare_random_init(snakemake.wildcards.model, snakemake.input.base, spec["seed"], snakemake.output[0])
    else:
        prepare_model(snakemake.wildcards.model, spec, snakemake.output[0])
