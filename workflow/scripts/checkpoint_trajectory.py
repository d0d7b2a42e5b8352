from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.plots.sweeps import trajectory_figure
    from llmgeom.analyses.checkpoint_trajectory import trajectory_table
    from llmgeom.core.io import write_table

    p = snakemake.params
    tables = {t: pd.read_csv(path) for t, path in zip(p.tables, snakemake.input.tables)}
    df = trajectory_table(tables, dict(p.steps), dict(p.series))
    write_table(df, snakemake.output.table)
    trajectory_figure(df, [snakemake.output.png, snakemake.output.pdf])
    print(f"{df['model'].nunique()} checkpoints, {df['metric'].nunique()} metrics")
