import pandas as pd

from llmgeom.plots.lsm import intrinsic_dimension_figure
from llmgeom.workflow.jobs import run_logged

with run_logged(snakemake.log[0]):
    intrinsic_dimension_figure(pd.read_csv(snakemake.input[0]), [snakemake.output.png, snakemake.output.pdf])
