"""Rule claims: the claims scorecard from the cross-model tables; published.csv."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import pandas as pd

    from llmgeom.analyses.bayes_tables import markdown_tables_html
    from llmgeom.analyses.claims import claims_table, to_markdown
    from llmgeom.core.io import write_table, write_text
    from llmgeom.core.published import published_table

    o, i = snakemake.output, snakemake.input
    tables = {t: (pd.read_csv(i[t]) if t in i.keys() else None) for t in snakemake.params.tables}
    card = claims_table(tables, models=snakemake.params.models, nulls=snakemake.params.nulls,
                        null_for=snakemake.params.null_for)
    write_table(card, o.csv)
    md = to_markdown(card)
    write_text(md, o.md)
    write_text(markdown_tables_html({"Claims: what this run found": md}), o.html)
    write_table(published_table(), o.published)
