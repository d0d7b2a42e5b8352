"""Rule aggregate_bayes: concatenate each per-model Bayesian-geometry table over models."""
from llmgeom.workflow.jobs import run_logged

with run_logged(snakemake.log[0]):
    from llmgeom.core.io import concat_tables, write_table

    for t in snakemake.params.tables:
        paths = [f"results/{m}/tables/{t}.csv" for m in snakemake.params.models]
        missing = [p for p in paths if p not in set(snakemake.input)]
        if missing:
            raise ValueError(f"inputs missing from the rule for table {t}: {missing}")
        write_table(concat_tables(paths), snakemake.output[t])
