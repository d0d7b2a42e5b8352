# Rate-distortion exponent k_RD per layer (LSM Theorem 10.8), beside the ID estimates. CPU, no model.
# Code: llmgeom.analyses.rate_distortion, llmgeom.measures.rate_distortion (scikit-learn KMeans).
summarize("rate_distortion", family="lsm", nulls=True)
TARGETS += expand("results/{model}/tables/rate_distortion.csv", model=MODELS)


rule rate_distortion:
    """LSM: held-out k-means distortion D(N) on a log grid of N, k_RD = -2 / slope on the straight range, per
    residual layer and for the final normed states, beside TwoNN / MLE / GRIDE from intrinsic_dimension.csv."""
    input:
        h5=f"results/{{model}}/activations/{ID_SET}.h5",
        ids="results/{model}/tables/intrinsic_dimension.csv",
        code=code("rate_distortion"),
    output:
        "results/{model}/tables/rate_distortion.csv",
    params:
        cfg=section_cfg("rate_distortion"),
    threads: 1
    resources:
        mem_mb=scaled_mem(4000),
        runtime=30,
    group:
        "analysis"
    log:
        "logs/rate_distortion/{model}.log",
    benchmark:
        "results/benchmarks/rate_distortion/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/rate_distortion.py"
