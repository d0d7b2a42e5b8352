# Intrinsic dimension of the residual stream per layer (LSM) and the shape of its profile over depth.
# Code: llmgeom.analyses.intrinsic_dimension (tables), llmgeom.measures.intrinsic_dimension (TwoNN, MLE).
summarize("intrinsic_dimension", "id_profile", family="lsm")
TARGETS += expand("results/{model}/tables/{table}.csv", model=MODELS, table=["intrinsic_dimension", "id_profile"])


rule intrinsic_dimension:
    """LSM: intrinsic dimension (TwoNN / MLE) of the residual stream per layer at corpus tokens, and
    the profile summary (peak layer, peak value, shape over relative depth)."""
    input:
        h5=f"results/{{model}}/activations/{ID_SET}.h5",
        code=code("intrinsic_dimension"),
    output:
        ids="results/{model}/tables/intrinsic_dimension.csv",
        profile="results/{model}/tables/id_profile.csv",
    params:
        estimators=config["intrinsic_dimension"]["estimators"],
        n_subsamples=config["intrinsic_dimension"]["n_subsamples"],
        subsample_size=config["intrinsic_dimension"]["subsample_size"],
        min_points=config["intrinsic_dimension"]["min_points"],
        mle_k=config["intrinsic_dimension"]["mle_k"],
        seed=config["intrinsic_dimension"]["seed"],
        disagreement_factor=config["intrinsic_dimension"]["disagreement_factor"],
        shape_tol=config["intrinsic_dimension"]["shape_tol"],
        profile_layers=config["intrinsic_dimension"]["profile_layers"],
    threads: 1
    priority: PRIORITY["intrinsic_dimension"]
    resources:
        mem_mb=scaled_mem(4000),
        runtime=30,
    group:
        "analysis"
    log:
        "logs/intrinsic_dimension/{model}.log",
    benchmark:
        "results/benchmarks/intrinsic_dimension/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/intrinsic_dimension.py"
