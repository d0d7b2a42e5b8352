rule prepare_model:
    """Model source (GGUF in a package, local HF directory or HF id) -> plain HF directory + manifest."""
    input:
        unpack(get_prepare_inputs),  # a random-init twin: its trained model's prepared directory
        code=code("prepare_model"),
    output:
        directory("resources/models/{model}"),
    wildcard_constraints:
        model=LLM_RE,  # wind-tunnel models come from train_wind_tunnel / wind_tunnel_checkpoint
    params:
        spec=get_source_params,
    priority: PRIORITY["prepare_model"]
    resources:
        mem_mb=scaled_mem(model_mem),
        runtime=30,
    log:
        "logs/prepare_model/{model}.log",
    benchmark:
        "results/benchmarks/prepare_model/{model}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/prepare_model.py"
