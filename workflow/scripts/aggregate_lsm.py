"""Cross-model LSM tables: for each table name, concatenate the per-model tables (model order of the config)."""
from pathlib import Path

from llmgeom.core.io import concat_tables, write_table
from llmgeom.workflow.jobs import run_logged

with run_logged(snakemake.log[0]):
    for table, out in zip(snakemake.params.tables, snakemake.output):
        assert Path(out).name == f"{table}.csv", (table, out)
        paths = [p for p in snakemake.input if Path(p).name == f"{table}.csv"]
        write_table(concat_tables(paths), out)
        print(f"[aggregate_lsm] {out}: {len(paths)} models")
