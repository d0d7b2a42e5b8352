from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.plots.sula import sula_calibration_figure, sula_pc1_figure

    i, o = snakemake.input, snakemake.output
    sula_calibration_figure(pd.read_csv(i.prompts), pd.read_csv(i.sula), [o.calibration, o.calibration_pdf])
    sula_pc1_figure(pd.read_csv(i.prompts), pd.read_csv(i.geometry), [o.pc1, o.pc1_pdf])
