"""Rule key_orthogonality: W_K column orthogonality per layer and key head, with baselines."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0], threads=snakemake.threads):
    from llmgeom.weights.key_orthogonality import key_orthogonality_from_dir
    from llmgeom.core.io import write_table

    p = snakemake.params
    df = key_orthogonality_from_dir(snakemake.input.model, model_name=snakemake.wildcards.model, seed=p.seed,
                                    dtype=p.dtype, random_init=p.random_init)
    write_table(df, snakemake.output[0])
