TARGETS += expand("results/{model}/tables/value_manifold.csv", model=MODELS)


rule value_manifold:
    """Paper III sec. 4: PCA of last-token value vectors and residual stream, per prompt set and layer."""
    input:
        h5=expand("results/{{model}}/activations/{promptset}.h5", promptset=VM_SETS),
        code=code("value_manifold"),
    output:
        "results/{model}/tables/value_manifold.csv",
    params:
        prompt_sets=VM_SETS,
        n_boot=config["value_manifold"]["n_boot"],
        ci=config["value_manifold"]["ci"],
        seed=config["value_manifold"]["seed"],
        layers=config["value_manifold"]["layers"],
    resources:
        mem_mb=scaled_mem(4000),
        runtime=30,
    group:
        "analysis"
    log:
        "logs/value_manifold/{model}.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/value_manifold.py"
