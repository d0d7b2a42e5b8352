from llmgeom.tables import concat_tables, write_table

write_table(concat_tables(snakemake.input), snakemake.output[0])
