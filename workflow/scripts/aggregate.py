from llmgeom.core.io import concat_tables, write_table
from llmgeom.workflow.jobs import run_logged

with run_logged(snakemake.log[0]):
    # only the tables: a rule may also list package code (code=pkg(...)) among its inputs
    write_table(concat_tables([p for p in snakemake.input if p.endswith(".csv")]), snakemake.output[0])
