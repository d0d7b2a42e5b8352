# Voronoi margins, the expressibility gap eta(eps) and perplexity (LSM), from the extraction file (no
# forward pass), and margin vs perplexity across models. Code: llmgeom.analyses.margins,
# llmgeom.measures.margins. Definitions: DESIGN.md sec. 3.
MARGIN_SET = config["margins"]["prompt_set"]

summarize("margins", "eta_curve", "expressibility_gap", "margin_histogram", family="lsm", nulls=True)
TARGETS += ["results/summary/margin_vs_perplexity.csv"]


rule margins:
    """LSM: margin quantiles, hard core, eta(eps) with its power-law fit (expressibility_gap.csv),
    the margin histogram and perplexity: four tables of one pass over the logit statistics."""
    input:
        h5=f"results/{{model}}/activations/{MARGIN_SET}.h5",
        code=code("margins"),
    output:
        margins="results/{model}/tables/margins.csv",
        eta_curve="results/{model}/tables/eta_curve.csv",
        expressibility_gap="results/{model}/tables/expressibility_gap.csv",
        margin_histogram="results/{model}/tables/margin_histogram.csv",
    params:
        cfg=section_cfg("margins"),
    threads: 1
    resources:
        mem_mb=scaled_mem(2000),
        runtime=10,
    group:
        "analysis"
    log:
        "logs/margins/{model}.log",
    benchmark:
        "results/benchmarks/margins/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/margins.py"


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
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/margin_vs_perplexity.log",
    benchmark:
        "results/benchmarks/margin_vs_perplexity.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/margin_vs_perplexity.py"
