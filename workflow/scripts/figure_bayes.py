"""Rule figure_bayes: the Bayesian-geometry figures (Paper III) from the cross-model tables."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.plots import bayes as bayes_plots

    inp, out = snakemake.input, snakemake.output
    for fig, draw in (("pc_scatter", bayes_plots.pc_scatter_figure),
                      ("explained_variance_layers", bayes_plots.explained_variance_layers_figure),
                      ("key_orthogonality", bayes_plots.key_orthogonality_figure),
                      ("attention_focusing", bayes_plots.attention_focusing_figure),
                      ("bayes_summary", bayes_plots.bayes_summary_figure)):
        pdf = next(p for p in out.pdf if p.endswith(f"/{fig}.pdf"))
        draw(pd.read_csv(inp[fig]), [out[fig], pdf])
