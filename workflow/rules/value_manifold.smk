# Value manifold (Paper III sec. 4): PCA of last-token value vectors and of the residual stream.
# Code: llmgeom.analyses.value_manifold (table), llmgeom.plots.value_manifold (figure).
summarize("value_manifold", family="value_manifold")
TARGETS += expand("results/{model}/tables/value_manifold.csv", model=MODELS)
TARGETS += expand("results/figures/value_manifold.{ext}", ext=["png", "pdf"])


rule value_manifold:
    """Paper III sec. 4: PCA of last-token value vectors and residual stream, per prompt set and layer."""
    input:
        h5=expand("results/{{model}}/activations/{promptset}.h5", promptset=VM_SETS),
        code=code("value_manifold"),
    output:
        "results/{model}/tables/value_manifold.csv",
    params:
        cfg=section_cfg("value_manifold"),
        prompt_sets=VM_SETS,
    priority: PRIORITY["value_manifold"]
    resources:
        mem_mb=scaled_mem(4000),
        runtime=30,
    group:
        "analysis"
    log:
        "logs/value_manifold/{model}.log",
    benchmark:
        "results/benchmarks/value_manifold/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/value_manifold.py"


rule figure_value_manifold:
    """PC1 / PC1+PC2 shares over depth, per model and prompt set."""
    input:
        "results/summary/value_manifold.csv",
        code=code("figure_value_manifold"),
    output:
        png=report(
            "results/figures/value_manifold.png",
            caption="../report/value_manifold.rst",
            category="Bayesian geometry",
        ),
        pdf="results/figures/value_manifold.pdf",
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/figure_value_manifold.log",
    benchmark:
        "results/benchmarks/figure_value_manifold.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_value_manifold.py"
