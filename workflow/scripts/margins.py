"""LSM: Voronoi margins, expressibility gap eta(eps), perplexity (from the extraction file)."""
import time

from llmgeom.analyses.margins import margin_tables
from llmgeom.core.io import write_table
from llmgeom.pipeline.jobs import run_logged
from llmgeom.pipeline.schema import call_with_config

with run_logged(snakemake.log[0], threads=snakemake.threads):
    p = snakemake.params
    t0 = time.time()
    tabs = call_with_config(margin_tables, p.cfg, snakemake.input.h5, model=snakemake.wildcards.model)
    for name, df in tabs.items():
        write_table(df, snakemake.output[name])
    fit = tabs["expressibility_gap"].iloc[0]
    print(f"[margins] {snakemake.wildcards.model}: beta={fit.beta:.3f} [{fit.beta_lo:.3f}, {fit.beta_hi:.3f}] "
          f"R2={fit.r2:.4f} alpha={fit.alpha:.3f}; {time.time() - t0:.1f} s")
