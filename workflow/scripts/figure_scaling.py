"""Rule figure_scaling: one figure per scaling statistic and the overview grid."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.plots.scaling import scaling_figures, scaling_overview

    o = snakemake.output
    df = pd.read_csv(snakemake.input.csv, keep_default_na=False, na_values=[""])  # text columns stay text
    scaling_figures(df, {k: [v] for k, v in o.items() if k not in ("overview", "pdf")})
    scaling_overview(df, [o.overview, o.pdf])
