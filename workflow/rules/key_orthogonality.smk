# Key orthogonality (Paper III sec. 4.2): W_K read from the weights, no prompts.
# Code: llmgeom.weights.key_orthogonality.
summarize("key_orthogonality", family="bayes", models=MODELS + WT_FINALS, nulls=True)  # wind-tunnel models: Table 2 rows


rule key_orthogonality:
    """GPU rule (the model server's weights): Paper III sec. 4.2, mean |cos| between W_K columns per layer and key
    head, Gaussian and random-init baselines."""
    input:
        model="resources/models/{model}",
        code=code("key_orthogonality"),
    output:
        "results/{model}/tables/key_orthogonality.csv",
    params:
        cfg=section_cfg("key_orthogonality"),
        dtype=get_dtype,
        device_map=get_device_map,
        device=config["extract"]["device"],
    threads: GPU_THREADS
    resources:
        **GPU_RESOURCES,
    log:
        "logs/key_orthogonality/{model}.log",
    benchmark:
        "results/benchmarks/key_orthogonality/{model}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/key_orthogonality.py"
