"""Rule bayes_tables: Table-1 / Table-2 analogues (CSV, Markdown, HTML) from the cross-model tables."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.analyses.bayes_tables import markdown_tables_html, table1, table2, to_markdown
    from llmgeom.core.io import write_table, write_text

    o = snakemake.output
    dr = pd.read_csv(snakemake.input.dr)
    nulls = snakemake.params.nulls  # null model -> the trained model it is the null of
    t1 = table1(dr, nulls=nulls)
    i = snakemake.input
    wt = pd.read_csv(i.wt) if i.get("wt") else None  # wind-tunnel rows, when the config has any
    if wt is not None:
        wt = wt[wt.model.isin(list(snakemake.params.wt_finals) + list(nulls))]
    t2 = table2(dr, pd.read_csv(i.ko), pd.read_csv(i.af), restricted_set=snakemake.params.restricted_set, wt=wt,
                wt_geometry=pd.read_csv(i.wt_geometry) if i.get("wt_geometry") else None, nulls=nulls)
    write_table(t1, o.t1)
    write_table(t2, o.t2)
    md1, md2 = to_markdown(t1, "table1"), to_markdown(t2, "table2")
    write_text(md1, o.md1)
    write_text(md2, o.md2)
    write_text(markdown_tables_html({"Table 1 analogue": md1, "Table 2 analogue": md2}), o.html)
