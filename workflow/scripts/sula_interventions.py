from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.analyses.interventions import intervention_summary
    from llmgeom.core.io import write_table
    from llmgeom.pipeline.schema import call_with_config

    p = snakemake.params
    df = call_with_config(intervention_summary, p.cfg, pd.read_csv(snakemake.input.per_prompt),
                          pd.read_csv(snakemake.input.axes), n_boot=p.n_boot, model=snakemake.wildcards.model)
    write_table(df, snakemake.output[0])
    print(df[["run", "axis", "edit", "mae_bits", "delta_mae_bits", "axis_corr_edited", "delta_axis_corr_edited",
              "axis_corr_final"]].to_string(index=False))
