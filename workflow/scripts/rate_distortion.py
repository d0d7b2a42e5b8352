"""LSM: rate-distortion exponent k_RD per layer beside the ID estimates."""
import time

import pandas as pd

from llmgeom.analyses.rate_distortion import rate_distortion_table
from llmgeom.core.io import write_table
from llmgeom.pipeline.jobs import run_logged
from llmgeom.pipeline.schema import call_with_config

with run_logged(snakemake.log[0], threads=snakemake.threads):
    t0 = time.time()
    df = call_with_config(rate_distortion_table, snakemake.params.cfg, snakemake.input.h5,
                          pd.read_csv(snakemake.input.ids), model=snakemake.wildcards.model)
    write_table(df, snakemake.output[0])
    res = df[df.states == "residual"]
    print(f"[rate_distortion] {snakemake.wildcards.model}: k_RD {res.k_rd.min():.1f}..{res.k_rd.max():.1f} over "
          f"{len(res)} layers, agrees with TwoNN at {int(res.agrees_twonn.sum())}; {time.time() - t0:.1f} s")
