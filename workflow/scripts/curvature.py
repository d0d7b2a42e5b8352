"""LSM sec. 13.3: local-PCA curvature proxy of the residual stream per layer."""
import time

import pandas as pd

from llmgeom.analyses.curvature import curvature_table
from llmgeom.core.io import write_table
from llmgeom.pipeline.jobs import run_logged
from llmgeom.pipeline.schema import call_with_config

with run_logged(snakemake.log[0], threads=snakemake.threads):
    p = snakemake.params
    t0 = time.time()
    df = call_with_config(curvature_table, p.cfg, snakemake.input.h5, pd.read_csv(snakemake.input.ids),
                          model=snakemake.wildcards.model)
    write_table(df, snakemake.output[0])
    print(f"[curvature] {snakemake.wildcards.model}: {len(df)} layers in {time.time() - t0:.1f} s")
