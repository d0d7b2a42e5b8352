"""Figure rules of the Bayesian-geometry analyses: dispatch on params.kind."""
from llmgeom.workflow.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.plots import bayes as bayes_plots

    draw = {
        "pc_scatter": bayes_plots.pc_scatter_figure,
        "explained_variance_layers": bayes_plots.explained_variance_layers_figure,
        "key_orthogonality": bayes_plots.key_orthogonality_figure,
        "attention_focusing": bayes_plots.attention_focusing_figure,
        "bayes_summary": bayes_plots.bayes_summary_figure,
    }[snakemake.params.kind]
    draw(pd.read_csv(snakemake.input[0]), [snakemake.output.png, snakemake.output.pdf])
