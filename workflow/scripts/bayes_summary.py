"""Rule bayes_summary: Table-1 / Table-2 analogues (CSV, Markdown, HTML) from the cross-model tables."""
from pathlib import Path

from llmgeom.workflow.jobs import run_logged


def write_text(path, text):
    p = Path(path)
    tmp = p.with_name(f".{p.name}.partial")
    tmp.write_text(text)
    tmp.replace(p)


with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.analyses.bayes_tables import markdown_tables_html, table1, table2, to_markdown
    from llmgeom.core.io import write_table

    dr = pd.read_csv(snakemake.input.dr)
    t1 = table1(dr)
    t2 = table2(dr, pd.read_csv(snakemake.input.ko), pd.read_csv(snakemake.input.af),
                restricted_set=snakemake.params.restricted_set)
    write_table(t1, snakemake.output.t1)
    write_table(t2, snakemake.output.t2)
    md1, md2 = to_markdown(t1, "table1"), to_markdown(t2, "table2")
    write_text(snakemake.output.md1, md1)
    write_text(snakemake.output.md2, md2)
    write_text(snakemake.output.html, markdown_tables_html({"Table 1 analogue": md1, "Table 2 analogue": md2}))
