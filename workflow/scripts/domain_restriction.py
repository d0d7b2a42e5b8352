"""Rule domain_restriction: entropy-stratified selections and their value-manifold statistics."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0], threads=snakemake.threads):
    from llmgeom.analyses.domain_restriction import domain_restriction_tables
    from llmgeom.core.io import write_table
    from llmgeom.pipeline.schema import call_with_config

    p = snakemake.params
    out = call_with_config(domain_restriction_tables, p.cfg, dict(zip(p.prompt_sets, snakemake.input.h5)),
                           model=snakemake.wildcards.model, mixed_set=p.mixed_set, labels=p.labels,
                           n_boot=p.n_boot, data_reps=p.data_reps)
    write_table(out["stats"], snakemake.output.stats)
    write_table(out["selection"], snakemake.output.selection)
    write_table(out["scores"], snakemake.output.scores)
