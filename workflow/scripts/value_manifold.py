from llmgeom.pipeline.jobs import run_logged
from llmgeom.analyses.value_manifold import value_manifold_table
from llmgeom.core.io import write_table

with run_logged(snakemake.log[0]):
    p = snakemake.params
    df = value_manifold_table(
        dict(zip(p.prompt_sets, snakemake.input.h5)),
        model=snakemake.wildcards.model,
        n_boot=p.n_boot,
        seed=p.seed,
        ci=p.ci,
        layers=p.layers,
    )
    write_table(df, snakemake.output[0])
