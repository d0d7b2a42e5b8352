from llmgeom.workflow.jobs import run_logged

with run_logged(snakemake.log[0]):
    from llmgeom.core.io import concat_tables, write_table

    tables = [p for p in snakemake.input if p.endswith(".csv")]  # not the code=pkg(...) inputs
    df = concat_tables(tables)
    write_table(df, snakemake.output[0])
    print(f"{len(df)} rows from {len(tables)} files")
