from llmgeom.workflow.jobs import run_logged
from llmgeom.models.sources import prepare_model

with run_logged(snakemake.log[0]):
    prepare_model(snakemake.wildcards.model, snakemake.params.spec, snakemake.output[0])
