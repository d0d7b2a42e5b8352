# Key orthogonality (Paper III sec. 4.2): W_K read from the weights, no prompts.
# Code: llmgeom.weights.key_orthogonality.
summarize("key_orthogonality", family="bayes", models=MODELS + WT_FINALS, nulls=True)  # wind-tunnel models: Table 2 rows


rule key_orthogonality:
    """Paper III sec. 4.2: mean |cos| between W_K columns per layer and key head, Gaussian and random-init baselines."""
    input:
        model="resources/models/{model}",
        code=code("key_orthogonality"),
    output:
        "results/{model}/tables/key_orthogonality.csv",
    params:
        cfg=section_cfg("key_orthogonality"),
        dtype=get_dtype,
    threads: 1
    resources:
        mem_mb=scaled_mem(model_mem),  # the trained model, and a float32 random-init copy: model_mem (float32)
        runtime=30,
    group:
        "analysis"
    log:
        "logs/key_orthogonality/{model}.log",
    benchmark:
        "results/benchmarks/key_orthogonality/{model}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/key_orthogonality.py"
