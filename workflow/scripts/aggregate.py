"""Rules aggregate_<family>: the cross-model tables of one family, each the per-model tables concatenated in the
order of its inputs (input and output named by the table)."""
from llmgeom.core.io import concat_tables, write_table
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    for table, path in snakemake.output.items():
        df = concat_tables(snakemake.input[table])
        write_table(df, path)
        print(f"[aggregate] {path}: {len(df)} rows from {len(snakemake.input[table])} models")
