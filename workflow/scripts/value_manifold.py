from llmgeom.pipeline.jobs import run_logged
from llmgeom.analyses.value_manifold import value_manifold_table
from llmgeom.core.io import write_table
from llmgeom.pipeline.schema import call_with_config

with run_logged(snakemake.log[0]):
    p = snakemake.params
    df = call_with_config(value_manifold_table, p.cfg, dict(zip(p.prompt_sets, snakemake.input.h5)),
                          model=snakemake.wildcards.model)
    write_table(df, snakemake.output[0])
