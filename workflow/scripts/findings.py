"""Rule findings: the front page results/index.html with the verdict matrix, the forest plots and the scaling
figures."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.plots.claims import findings_page, forest_plots, verdict_matrix

    o = snakemake.output
    card = pd.read_csv(snakemake.input.card, keep_default_na=False)  # text columns stay text ("" not NaN)
    verdict_matrix(card, [o.matrix, o.pdf[0]])
    forest_plots(card, [o.forest, o.pdf[1]])
    findings_page(card, o.matrix, o.forest, o.page, scaling_pngs=list(snakemake.input.scaling))
