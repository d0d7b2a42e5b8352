# Latent semantic manifolds (LSM), the output side: Voronoi margins, the expressibility gap eta(eps),
# perplexity, the Fisher information metric, cross-model tables and figures. Definitions: DESIGN.md sec. 3.
from llmgeom.workflow.config import check_lsm_config  # light: no torch/scikit-learn at DAG time

check_lsm_config(config)
MARGIN_SET = config["margins"]["prompt_set"]
FISHER_SET = config["fisher"]["prompt_set"]
LSM_MODEL_TABLES = ["id_profile", "curvature", "margins", "eta_curve", "expressibility_gap",
                    "margin_histogram", "fisher", "fisher_summary"]
LSM_FIGURES = ["curvature", "margin_histogram", "expressibility_gap", "margin_vs_perplexity"]

TARGETS += expand("results/summary/{table}.csv", table=LSM_MODEL_TABLES + ["margin_vs_perplexity"])
TARGETS += expand("results/figures/{fig}.{ext}", fig=LSM_FIGURES, ext=["png", "pdf"])


rule margins:
    """LSM: margin quantiles, hard core, eta(eps) with its power-law fit, perplexity (no forward pass)."""
    input:
        h5=f"results/{{model}}/activations/{MARGIN_SET}.h5",
        code=code("margins"),
    output:
        margins="results/{model}/tables/margins.csv",
        eta_curve="results/{model}/tables/eta_curve.csv",
        expressibility_gap="results/{model}/tables/expressibility_gap.csv",
        margin_histogram="results/{model}/tables/margin_histogram.csv",
    params:
        opts={k: v for k, v in config["margins"].items() if k != "prompt_set"},
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    group:
        "analysis"
    log:
        "logs/margins/{model}.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/margins.py"


rule fisher:
    """LSM: trace and effective rank of the Fisher metric G(h) at sampled corpus positions (CPU, float64)."""
    input:
        h5=f"results/{{model}}/activations/{FISHER_SET}.h5",
        model="resources/models/{model}",
        code=code("fisher"),
    output:
        fisher="results/{model}/tables/fisher.csv",
        fisher_summary="results/{model}/tables/fisher_summary.csv",
    params:
        opts={k: config["fisher"][k] for k in ("n_positions", "max_tokens", "tail_mass", "seed", "batch")},
    threads: config["fisher"]["threads"]
    resources:
        # the whole model is loaded on CPU in float32 to read its unembedding: the model's own memory
        mem_mb=lambda w, attempt: extract_mem_mb(config["models"][w.model], attempt),
        runtime=lambda w: mcfg(w, "runtime"),
    group:
        "analysis"
    log:
        "logs/fisher/{model}.log",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/fisher.py"


rule aggregate_lsm:
    """Cross-model LSM tables: each per-model table concatenated over models (one job for all)."""
    input:
        expand("results/{model}/tables/{table}.csv", table=LSM_MODEL_TABLES, model=MODELS),
        code=code("aggregate_lsm"),
    output:
        [
            report(
                f"results/summary/{t}.csv",
                caption="../report/lsm_tables.rst",
                category="Tables",
                labels={"table": t},
            )
            for t in LSM_MODEL_TABLES
        ],
    params:
        tables=LSM_MODEL_TABLES,
        models=MODELS,
    resources:
        mem_mb=1000,
        runtime=5,
    group:
        "summary"
    log:
        "logs/aggregate_lsm.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/aggregate_lsm.py"


rule margin_vs_perplexity:
    """LSM: median margin and perplexity per model, and their rank correlation across models."""
    input:
        expand("results/{model}/tables/margins.csv", model=MODELS),
        code=code("margin_vs_perplexity"),
    output:
        report(
            "results/summary/margin_vs_perplexity.csv",
            caption="../report/margin_vs_perplexity_table.rst",
            category="Latent semantic manifolds",
        ),
    resources:
        mem_mb=1000,
        runtime=5,
    group:
        "summary"
    log:
        "logs/margin_vs_perplexity.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/margin_vs_perplexity.py"


rule figures_lsm:
    """LSM figures (one job): curvature, margin histogram, expressibility gap, margin vs perplexity."""
    input:
        curvature="results/summary/curvature.csv",
        hist="results/summary/margin_histogram.csv",
        margins="results/summary/margins.csv",
        curve="results/summary/eta_curve.csv",
        fit="results/summary/expressibility_gap.csv",
        mvp="results/summary/margin_vs_perplexity.csv",
        code=code("figure_lsm"),
    output:
        curvature=report("results/figures/curvature.png", caption="../report/curvature.rst",
                         category="Latent semantic manifolds"),
        margin_histogram=report("results/figures/margin_histogram.png", caption="../report/margin_histogram.rst",
                                category="Latent semantic manifolds"),
        expressibility_gap=report("results/figures/expressibility_gap.png",
                                  caption="../report/expressibility_gap.rst", category="Latent semantic manifolds"),
        margin_vs_perplexity=report("results/figures/margin_vs_perplexity.png",
                                    caption="../report/margin_vs_perplexity.rst", category="Latent semantic manifolds"),
        pdf=expand("results/figures/{fig}.pdf", fig=LSM_FIGURES),
    resources:
        mem_mb=1000,
        runtime=5,
    group:
        "summary"
    log:
        "logs/figures_lsm.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_lsm.py"
