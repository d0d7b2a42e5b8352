from llmgeom.workflow_support import run_logged
from llmgeom.tables import value_manifold_table, write_table

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
