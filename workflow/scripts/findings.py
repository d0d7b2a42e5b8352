"""Rule findings: the front page results/index.html with the drifted headline values (when the study has a
reference), the verdict matrix, the forest plots and the scaling figures."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.plots.claims import findings_page, forest_plots, verdict_matrix

    o, i = snakemake.output, snakemake.input
    card = pd.read_csv(i.card, keep_default_na=False)  # text columns stay text ("" not NaN)
    drift = pd.read_csv(i.drift, keep_default_na=False) if "drift" in i.keys() else None
    verdict_matrix(card, [o.matrix, o.pdf[0]])
    forest_plots(card, [o.forest, o.pdf[1]])
    findings_page(card, o.matrix, o.forest, o.page, scaling_pngs=list(i.scaling), drift=drift,
                  reference_path=snakemake.params.reference)
