"""Rule key_orthogonality: W_K column orthogonality per layer and key head, with baselines."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0], threads=snakemake.threads):
    from llmgeom.weights.key_orthogonality import key_orthogonality_from_dir
    from llmgeom.core.io import write_table
    from llmgeom.pipeline.schema import call_with_config

    p = snakemake.params
    df = call_with_config(key_orthogonality_from_dir, p.cfg, snakemake.input.model,
                          model_name=snakemake.wildcards.model, dtype=p.dtype)
    write_table(df, snakemake.output[0])
