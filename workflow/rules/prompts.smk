rule build_prompts:
    """Model-independent prompt set from real text (Wikipedia summaries, stdlib source), seeded; every prompt at most
    its token budget in tokens of the reference tokenizer (prompts.tokenizer)."""
    input:
        tokenizer=get_reference_tokenizer,
        code=code("build_prompts"),
    output:
        "resources/prompts/{promptset}.jsonl",
    params:
        spec=get_prompt_spec,
        seed=get_set_seed,
        token_budget=get_token_budget,
        tokenizer=get_reference_tokenizer_name,
    priority: PRIORITY["build_prompts"]
    resources:
        mem_mb=scaled_mem(2000),
        runtime=10,
    log:
        "logs/build_prompts/{promptset}.log",
    benchmark:
        "results/benchmarks/build_prompts/{promptset}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/build_prompts.py"
