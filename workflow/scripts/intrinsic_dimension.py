"""LSM: intrinsic dimension of the residual stream per layer, and the shape of its profile over depth."""
import time

from llmgeom.analyses.intrinsic_dimension import id_profile_table
from llmgeom.analyses.intrinsic_dimension import intrinsic_dimension_table
from llmgeom.core.io import write_table
from llmgeom.workflow.jobs import run_logged

with run_logged(snakemake.log[0], threads=snakemake.threads):
    p = snakemake.params
    t0 = time.time()
    df = intrinsic_dimension_table(
        snakemake.input.h5,
        model=snakemake.wildcards.model,
        estimators=p.estimators,
        n_subsamples=p.n_subsamples,
        subsample_size=p.subsample_size,
        min_points=p.min_points,
        mle_k=p.mle_k,
        seed=p.seed,
        disagreement_factor=p.disagreement_factor,
    )
    write_table(df, snakemake.output.ids)
    prof = id_profile_table(df, shape_tol=p.shape_tol, layers=p.profile_layers)
    write_table(prof, snakemake.output.profile)
    for r in prof.itertuples():
        print(f"[intrinsic_dimension] {r.model} {r.estimator}: peak {r.peak_id:.2f} at layer {r.peak_layer} "
              f"(relative depth {r.peak_relative_depth:.2f}), shape {r.shape}")
    print(f"[intrinsic_dimension] {snakemake.wildcards.model}: {time.time() - t0:.1f} s")
