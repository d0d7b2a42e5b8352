TARGETS += [
    "results/summary/value_manifold.csv",
    "results/summary/intrinsic_dimension.csv",
    "results/figures/value_manifold.png",
    "results/figures/value_manifold.pdf",
    "results/figures/intrinsic_dimension.png",
    "results/figures/intrinsic_dimension.pdf",
]


rule aggregate:
    """Cross-model table: concatenation of per-model tables."""
    input:
        lambda w: expand("results/{model}/tables/{table}.csv", model=MODELS, table=w.table),
        code=code("aggregate"),
    output:
        report(
            "results/summary/{table}.csv",
            caption="../report/summary_table.rst",
            category="Tables",
            labels={"table": "{table}"},
        ),
    wildcard_constraints:
        table="value_manifold|intrinsic_dimension",
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/aggregate/{table}.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/aggregate.py"


rule figure_value_manifold:
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
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_value_manifold.py"


rule figure_intrinsic_dimension:
    input:
        "results/summary/intrinsic_dimension.csv",
        code=code("figure_intrinsic_dimension"),
    output:
        png=report(
            "results/figures/intrinsic_dimension.png",
            caption="../report/intrinsic_dimension.rst",
            category="Latent semantic manifolds",
        ),
        pdf="results/figures/intrinsic_dimension.pdf",
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/figure_intrinsic_dimension.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_intrinsic_dimension.py"
