TARGETS += expand("results/{model}/tables/intrinsic_dimension.csv", model=MODELS)


rule intrinsic_dimension:
    """LSM: intrinsic dimension (TwoNN / MLE) of the residual stream per layer at corpus tokens."""
    input:
        h5=f"results/{{model}}/activations/{ID_SET}.h5",
    output:
        "results/{model}/tables/intrinsic_dimension.csv",
    params:
        estimators=config["intrinsic_dimension"]["estimators"],
        n_subsamples=config["intrinsic_dimension"]["n_subsamples"],
        subsample_size=config["intrinsic_dimension"]["subsample_size"],
        min_points=config["intrinsic_dimension"]["min_points"],
        mle_k=config["intrinsic_dimension"]["mle_k"],
        seed=config["intrinsic_dimension"]["seed"],
    resources:
        mem_mb=4000,
        runtime=30,
    group:
        "analysis"
    log:
        "logs/intrinsic_dimension/{model}.log",
    script:
        "../scripts/intrinsic_dimension.py"
