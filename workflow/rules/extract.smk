rule extract:
    """GPU rule: activations of one model on one prompt set -> HDF5 (DESIGN.md section 2)."""
    input:
        model="resources/models/{model}",
        prompts="resources/prompts/{promptset}.jsonl",
        code=code("extract"),
    output:
        "results/{model}/activations/{promptset}.h5",
    params:
        cfg=section_cfg("extract"),
        dtype=get_dtype,
        batch_size=get_batch_size,
        device_map=get_device_map,
        corpus=get_is_corpus,
        attention=get_attention,
        candidates_key=None,
        max_tokens=get_token_budget,
        seed=get_set_seed,
    threads: GPU_THREADS
    resources:
        **GPU_RESOURCES,
    log:
        "logs/extract/{model}/{promptset}.log",
    benchmark:
        "results/benchmarks/extract/{model}/{promptset}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/extract.py"
