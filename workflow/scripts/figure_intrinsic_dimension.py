import pandas as pd

from llmgeom.plotting import intrinsic_dimension_figure
from llmgeom.workflow_support import run_logged

with run_logged(snakemake.log[0]):
    intrinsic_dimension_figure(pd.read_csv(snakemake.input[0]), [snakemake.output.png, snakemake.output.pdf])
