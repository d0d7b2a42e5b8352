# Attention focusing (Paper III sec. 4.2): final-query attention entropy over depth.
# Code: llmgeom.analyses.attention_focusing.
AF_SET = config["attention_focusing"]["prompt_set"]

summarize("attention_focusing", "attention_focusing_summary", family="bayes")


rule attention_focusing:
    """Paper III sec. 4.2: final-query attention entropy per head and layer; focusing first -> last layer."""
    input:
        h5=f"results/{{model}}/activations/{AF_SET}.h5",
        code=code("attention_focusing"),
    output:
        detail="results/{model}/tables/attention_focusing.csv",
        summary="results/{model}/tables/attention_focusing_summary.csv",
    threads: 1
    resources:
        mem_mb=scaled_mem(2000),
        runtime=10,
    group:
        "analysis"
    log:
        "logs/attention_focusing/{model}.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/attention_focusing.py"
