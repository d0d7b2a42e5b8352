"""Rule drift: results/summary/drift.csv, this run's headline values against the study's reference."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.analyses.drift import checked_statistics, drift_table, headline_values, read_reference
    from llmgeom.core.io import write_table

    i = snakemake.input
    reference = read_reference(i.reference) if "reference" in i.keys() else None
    scaling = pd.read_csv(i.scaling, keep_default_na=False, na_values=[""])
    claims = pd.read_csv(i.claims, keep_default_na=False)  # text columns stay text ("" not NaN)
    values = headline_values(scaling, claims, statistics=checked_statistics(reference))
    drift = drift_table(values, reference, reference_path=snakemake.params.reference)
    write_table(drift, snakemake.output.csv)
    print(f"{int(drift.within.sum())} of {len(drift)} headline values within {snakemake.params.reference}")
