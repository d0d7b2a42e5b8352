from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.plots.sula import interventions_figure

    interventions_figure(pd.read_csv(snakemake.input.table), [snakemake.output.png, snakemake.output.pdf])
