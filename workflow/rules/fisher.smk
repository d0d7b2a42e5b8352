# Fisher information metric of the next-token distribution (LSM). Code: llmgeom.analyses.fisher
# (numpy, float64), llmgeom.weights.unembedding (reads W_U).
FISHER_SET = config["fisher"]["prompt_set"]

summarize("fisher", "fisher_summary", family="lsm")


rule fisher:
    """LSM: trace and effective rank of the Fisher metric G(h) at sampled corpus positions (CPU, float64)."""
    input:
        h5=f"results/{{model}}/activations/{FISHER_SET}.h5",
        model="resources/models/{model}",
        code=code("fisher"),
    output:
        fisher="results/{model}/tables/fisher.csv",
        fisher_summary="results/{model}/tables/fisher_summary.csv",
    params:
        cfg=section_cfg("fisher"),
    threads: config["fisher"]["threads"]
    priority: PRIORITY["fisher"]
    resources:
        # the whole model is loaded on CPU in float32 to read its unembedding: model_mem sizes it for float32
        mem_mb=scaled_mem(model_mem),
        runtime=lambda w: mcfg(w, "runtime"),
    group:
        "analysis"
    log:
        "logs/fisher/{model}.log",
    benchmark:
        "results/benchmarks/fisher/{model}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/fisher.py"
