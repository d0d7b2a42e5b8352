from llmgeom.workflow_support import run_logged

with run_logged(snakemake.log[0]):
    from llmgeom.tables import concat_tables, write_table

    df = concat_tables(snakemake.input)
    write_table(df, snakemake.output[0])
    print(f"{len(df)} rows from {len(snakemake.input)} files")
