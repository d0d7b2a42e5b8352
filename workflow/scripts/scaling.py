"""Rule scaling: results/summary/scaling.csv from the cross-model tables and the models' parameter counts."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.analyses.scaling import scaling_table
    from llmgeom.core.io import write_table
    from llmgeom.weights.model_size import parameter_counts

    i, p = snakemake.input, snakemake.params
    tables = {t: (pd.read_csv(i[t]) if t in i.keys() else None) for t in p.tables}
    sizes = pd.DataFrame([dict(model=m, **parameter_counts(d)) for m, d in zip(p.models, i.models)])
    write_table(scaling_table(tables, sizes, models=p.models, nulls=p.nulls), snakemake.output.csv)
