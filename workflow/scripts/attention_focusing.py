"""Rule attention_focusing: final-query attention entropy per head and layer, focusing summary."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0], threads=snakemake.threads):
    from llmgeom.analyses.attention_focusing import attention_focusing_tables
    from llmgeom.core.io import write_table
    from llmgeom.pipeline.schema import call_with_config

    detail, summary = call_with_config(attention_focusing_tables, snakemake.params.cfg, snakemake.input.h5,
                                       model=snakemake.wildcards.model)
    write_table(detail, snakemake.output.detail)
    write_table(summary, snakemake.output.summary)
