from llmgeom.workflow_support import run_logged
from llmgeom.tables import intrinsic_dimension_table, write_table

with run_logged(snakemake.log[0]):
    p = snakemake.params
    df = intrinsic_dimension_table(
        snakemake.input.h5,
        model=snakemake.wildcards.model,
        estimators=p.estimators,
        n_subsamples=p.n_subsamples,
        subsample_size=p.subsample_size,
        min_points=p.min_points,
        mle_k=p.mle_k,
        seed=p.seed,
    )
    write_table(df, snakemake.output[0])
