"""LSM: margin-adaptive decoding (NLL, top-1 ECE) at sampled corpus positions."""
import time

from llmgeom.analyses.decoding import decoding_table
from llmgeom.core.io import write_table
from llmgeom.weights.unembedding import load_unembedding
from llmgeom.pipeline.jobs import run_logged
from llmgeom.pipeline.schema import call_with_config

with run_logged(snakemake.log[0], threads=snakemake.threads):
    t0 = time.time()
    unembedding = load_unembedding(snakemake.input.model)  # the only step that reads weights
    df = call_with_config(decoding_table, snakemake.params.cfg, snakemake.input.h5, unembedding,
                          model=snakemake.wildcards.model)
    write_table(df, snakemake.output[0])
    r = df.iloc[0]
    print(f"[decoding] {snakemake.wildcards.model}: adaptive - single NLL {r.delta_nll_adaptive_vs_single:+.4f} "
          f"[{r.delta_nll_adaptive_vs_single_lo:+.4f}, {r.delta_nll_adaptive_vs_single_hi:+.4f}] nats; "
          f"{time.time() - t0:.1f} s")
