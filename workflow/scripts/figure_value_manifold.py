import pandas as pd

from llmgeom.plots.value_manifold import value_manifold_figure
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    value_manifold_figure(pd.read_csv(snakemake.input[0]), [snakemake.output.png, snakemake.output.pdf])
