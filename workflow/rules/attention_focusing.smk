# Attention focusing (Paper III sec. 4.2): final-query attention entropy over depth.
# Code: llmgeom.analyses.attention_focusing.
AF_SET = config["attention_focusing"]["prompt_set"]

summarize("attention_focusing", "attention_focusing_summary", family="bayes", models=MODELS + WT_FINALS, nulls=True)


rule attention_focusing:
    """Paper III sec. 4.2: final-query attention entropy per head and layer; focusing first -> last layer."""
    input:
        # wind-tunnel models: their task's prompt set (every prompt is a query with an exact posterior)
        h5=lambda w: f"results/{w.model}/activations/{'wind_tunnel' if w.model in WT else AF_SET}.h5",
        code=code("attention_focusing"),
    output:
        detail="results/{model}/tables/attention_focusing.csv",
        summary="results/{model}/tables/attention_focusing_summary.csv",
    params:
        cfg=section_cfg("attention_focusing"),
    threads: 1
    resources:
        mem_mb=scaled_mem(2000),
        runtime=10,
    group:
        "analysis"
    log:
        "logs/attention_focusing/{model}.log",
    benchmark:
        "results/benchmarks/attention_focusing/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/attention_focusing.py"
