from llmgeom.pipeline.jobs import run_logged
from llmgeom.models.sources import prepare_tokenizer

with run_logged(snakemake.log[0]):
    sha = prepare_tokenizer(snakemake.wildcards.model, snakemake.params.spec, snakemake.output[0])
    print(f"tokenizer of {snakemake.wildcards.model}: {snakemake.output[0]}, sha256 {sha}")
