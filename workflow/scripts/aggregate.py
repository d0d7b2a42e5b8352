"""Rule aggregate: one cross-model table, the per-model tables concatenated in the order of the inputs."""
from llmgeom.core.io import concat_tables, write_table
from llmgeom.workflow.jobs import run_logged

with run_logged(snakemake.log[0]):
    df = concat_tables(snakemake.input.tables)
    write_table(df, snakemake.output[0])
    print(f"[aggregate] {snakemake.output[0]}: {len(df)} rows from {len(snakemake.input.tables)} models")
