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


rule prepare_tokenizer:
    """A model's tokenizer alone as resources/tokenizers/{model}/tokenizer.json (read from the GGUF header, or saved
    from the Hugging Face directory): the reference tokenizer of the prompt sets (prompts.tokenizer), so that they
    do not wait for, nor rebuild after, the model's preparation."""
    input:
        code=code("prepare_tokenizer"),
    output:
        "resources/tokenizers/{model}/tokenizer.json",
    wildcard_constraints:
        model=LLM_RE,
    params:
        spec=get_source_params,
    priority: PRIORITY["prepare_tokenizer"]
    resources:
        mem_mb=scaled_mem(2000),
        runtime=10,
    log:
        "logs/prepare_tokenizer/{model}.log",
    benchmark:
        "results/benchmarks/prepare_tokenizer/{model}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/prepare_tokenizer.py"
