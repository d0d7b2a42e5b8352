"""LSM: cross-model relation of median margin and perplexity."""
from llmgeom.analyses.margins import margin_vs_perplexity_table
from llmgeom.core.io import concat_tables, write_table
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    write_table(margin_vs_perplexity_table(concat_tables([p for p in snakemake.input if p.endswith(".csv")])), snakemake.output[0])
