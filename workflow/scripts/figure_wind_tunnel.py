"""Rule figure_wind_tunnel: calibration and PC1 geometry of the wind-tunnel models."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.plots.wind_tunnel import wind_tunnel_figure

    i, o = snakemake.input, snakemake.output
    wind_tunnel_figure(pd.read_csv(i.prompts), pd.read_csv(i.summary), pd.read_csv(i.geometry), [o.png, o.pdf],
                       models=snakemake.params.finals)
