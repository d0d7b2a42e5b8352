# Local-PCA curvature proxy of the residual stream (LSM sec. 13.3). Code: llmgeom.analyses.curvature.
summarize("curvature", family="lsm", nulls=True)
TARGETS += expand("results/{model}/tables/curvature.csv", model=MODELS)


rule curvature:
    """LSM sec. 13.3: fraction of local variance outside the top-m local PCA directions per layer."""
    input:
        h5=f"results/{{model}}/activations/{ID_SET}.h5",
        ids="results/{model}/tables/intrinsic_dimension.csv",
        code=code("curvature"),
    output:
        "results/{model}/tables/curvature.csv",
    params:
        cfg=section_cfg("curvature"),
    threads: 1
    priority: PRIORITY["curvature"]
    resources:
        mem_mb=scaled_mem(4000),
        runtime=30,
    group:
        "analysis"
    log:
        "logs/curvature/{model}.log",
    benchmark:
        "results/benchmarks/curvature/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/curvature.py"
