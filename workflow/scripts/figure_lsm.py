"""Rule figure_lsm: LSM figures from the cross-model tables (one job draws all of them)."""
import pandas as pd

from llmgeom.plots import lsm as lsm_plots
from llmgeom.pipeline.jobs import run_logged

inp, out = snakemake.input, snakemake.output


def paths(name):
    return [out[name], next(p for p in out.pdf if p.endswith(f"/{name}.pdf"))]


with run_logged(snakemake.log[0]):
    lsm_plots.intrinsic_dimension_figure(pd.read_csv(inp.intrinsic_dimension), paths("intrinsic_dimension"))
    lsm_plots.curvature_figure(pd.read_csv(inp.curvature), paths("curvature"))
    lsm_plots.margin_histogram_figure(pd.read_csv(inp.hist), paths("margin_histogram"),
                                      margins=pd.read_csv(inp.margins))
    lsm_plots.expressibility_gap_figure(pd.read_csv(inp.curve), pd.read_csv(inp.fit), paths("expressibility_gap"))
    lsm_plots.margin_vs_perplexity_figure(pd.read_csv(inp.mvp), paths("margin_vs_perplexity"))
