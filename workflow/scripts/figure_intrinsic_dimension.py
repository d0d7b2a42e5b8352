import pandas as pd

from llmgeom.plotting import intrinsic_dimension_figure

intrinsic_dimension_figure(pd.read_csv(snakemake.input[0]), [snakemake.output.png, snakemake.output.pdf])
