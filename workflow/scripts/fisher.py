"""LSM: Fisher information metric trace and effective rank at sampled corpus positions."""
import time

from llmgeom.analyses.fisher import fisher_tables
from llmgeom.core.io import write_table
from llmgeom.weights.unembedding import load_unembedding
from llmgeom.pipeline.jobs import run_logged
from llmgeom.pipeline.schema import call_with_config

with run_logged(snakemake.log[0], threads=snakemake.threads):
    p = snakemake.params
    t0 = time.time()
    unembedding = load_unembedding(snakemake.input.model)  # the only step that reads weights
    tabs = call_with_config(fisher_tables, p.cfg, snakemake.input.h5, unembedding, model=snakemake.wildcards.model)
    for name, df in tabs.items():
        write_table(df, snakemake.output[name])
    s = tabs["fisher_summary"].iloc[0]
    print(f"[fisher] {snakemake.wildcards.model}: median trace {s.trace_median:.4g}, median effective rank "
          f"{s.effective_rank_median:.3g}, margin check max |diff| {s.margin_check_max_abs_diff:.2g}; "
          f"{time.time() - t0:.1f} s")
