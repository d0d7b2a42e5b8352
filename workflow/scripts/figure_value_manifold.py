import pandas as pd

from llmgeom.plotting import value_manifold_figure

value_manifold_figure(pd.read_csv(snakemake.input[0]), [snakemake.output.png, snakemake.output.pdf])
