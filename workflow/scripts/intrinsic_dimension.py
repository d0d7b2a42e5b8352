"""LSM: intrinsic dimension of the residual stream per layer (token positions and, when a last-token set is
configured, last-token states over prompts), GRIDE's scale curve, and the shape of each profile over depth."""
import time

import pandas as pd

from llmgeom.analyses.intrinsic_dimension import id_profile_table
from llmgeom.analyses.intrinsic_dimension import intrinsic_dimension_table
from llmgeom.analyses.intrinsic_dimension import last_token_id_table
from llmgeom.core.io import write_table
from llmgeom.pipeline.jobs import run_logged
from llmgeom.pipeline.schema import call_with_config

with run_logged(snakemake.log[0], threads=snakemake.threads):
    p = snakemake.params
    model = snakemake.wildcards.model
    t0 = time.time()
    df, scale = call_with_config(intrinsic_dimension_table, p.cfg, snakemake.input.h5, model=model, return_scale=True)
    write_table(df, snakemake.output.ids)
    t1 = time.time()
    if getattr(snakemake.input, "last_token", None):
        last, last_scale = call_with_config(last_token_id_table, p.cfg, snakemake.input.last_token, model=model)
    else:
        print("[intrinsic_dimension] no last-token set (intrinsic_dimension.last_token_set not among prompts.sets):"
              " id_last_token.csv is empty")
        last, last_scale = df.head(0), scale.head(0)
    write_table(last, snakemake.output.last_token)
    write_table(pd.concat([scale, last_scale], ignore_index=True), snakemake.output.scale)
    prof = call_with_config(id_profile_table, p.cfg, pd.concat([df, last], ignore_index=True))
    write_table(prof, snakemake.output.profile)
    for r in prof.itertuples():
        print(f"[intrinsic_dimension] {r.model} {r.quantity} {r.estimator}: peak {r.peak_id:.2f} at layer "
              f"{r.peak_layer} (relative depth {r.peak_relative_depth:.2f}), shape {r.shape}, "
              f"agrees with {r.agrees_with}")
    print(f"[intrinsic_dimension] {model}: {t1 - t0:.1f} s token positions, {time.time() - t1:.1f} s last token")
