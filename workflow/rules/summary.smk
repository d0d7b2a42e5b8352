# Cross-model tables and the figures drawn from them. Included after every rule file that registers
# per-model tables with summarize(...) (common.smk): rules `aggregate_<family>` concatenate each over models.
# Code: llmgeom.core.io.concat_tables (aggregate), llmgeom.analyses.bayes_tables (Table 1 / Table 2),
# llmgeom.plots.bayes and llmgeom.plots.lsm (figures).
BAYES_FIGURES = ["pc_scatter", "explained_variance_layers", "key_orthogonality", "attention_focusing",
                 "bayes_summary"]
LSM_FIGURES = ["intrinsic_dimension", "curvature", "margin_histogram", "expressibility_gap", "margin_vs_perplexity"]
TARGETS += expand("results/summary/{t}.{ext}", t=["table1", "table2"], ext=["csv", "md"])
TARGETS += ["results/summary/bayes_tables.html"]
TARGETS += expand("results/figures/{fig}.{ext}", fig=BAYES_FIGURES + LSM_FIGURES, ext=["png", "pdf"])


# One aggregate job per family of tables (summarize(..., family=...)): a few ~1 s jobs instead of one per table;
# the caption's paragraph is the family's (params.family). Rules aggregate_<family>.
SUMMARY_FAMILIES = {}
for _t, _spec in SUMMARY_TABLES.items():
    SUMMARY_FAMILIES.setdefault(_spec["family"], []).append(_t)

for _fam, _tables in SUMMARY_FAMILIES.items():

    rule:
        name:
            f"aggregate_{_fam}"
        # Cross-model tables results/summary/<table>.csv of one family: each table's per-model tables
        # concatenated (model order of MODELS, or the models given to summarize); one named input per table.
        input:
            **{t: expand("results/{model}/{folder}/{table}.csv", model=SUMMARY_TABLES[t]["models"], table=t,
                         folder=SUMMARY_TABLES[t]["folder"]) for t in _tables},
            code=code("aggregate"),
        output:
            **{t: report(f"results/summary/{t}.csv", caption="../report/summary_table.rst",
                         category=summary_report(_fam, "category"), subcategory=summary_report(_fam, "subcategory"),
                         labels={"table": t})
               for t in _tables},
        params:
            family=_fam,  # selects the caption's paragraph
        resources:
            mem_mb=scaled_mem(1000),
            runtime=5,
        group:
            "summary"
        log:
            f"logs/aggregate/{_fam}.log",
        benchmark:
            f"results/benchmarks/aggregate/{_fam}.tsv"
        conda:
            "../../envs/analysis.yaml"
        script:
            "../scripts/aggregate.py"


rule bayes_tables:
    """Table-1 and Table-2 analogues of Paper III across models: CSV, Markdown and an HTML rendering."""
    input:
        dr="results/summary/domain_restriction.csv",
        ko="results/summary/key_orthogonality.csv",
        af="results/summary/attention_focusing_summary.csv",
        **({"wt": "results/summary/wind_tunnel.csv", "wt_geometry": "results/summary/wind_tunnel_geometry.csv"}
           if WT_MODELS else {}),  # wind-tunnel rows of Table 2
        code=code("bayes_tables"),
    output:
        t1=report("results/summary/table1.csv", caption="../report/bayes_tables.rst",
                  category="Bayesian geometry", subcategory="Cross-model summary", labels={"table": "table1 (csv)"}),
        t2=report("results/summary/table2.csv", caption="../report/bayes_tables.rst",
                  category="Bayesian geometry", subcategory="Cross-model summary", labels={"table": "table2 (csv)"}),
        md1=report("results/summary/table1.md", caption="../report/bayes_tables.rst",
                   category="Bayesian geometry", subcategory="Cross-model summary",
                   labels={"table": "table1 (markdown)"}),
        md2=report("results/summary/table2.md", caption="../report/bayes_tables.rst",
                   category="Bayesian geometry", subcategory="Cross-model summary",
                   labels={"table": "table2 (markdown)"}),
        html=report("results/summary/bayes_tables.html", caption="../report/bayes_tables.rst",
                    category="Bayesian geometry", subcategory="Cross-model summary",
                    labels={"table": "tables 1 and 2"}),
    params:
        restricted_set=DR["summary"],
        wt_finals=WT_FINALS,
        nulls={n: e["null_of"] for n, e in NULLS.items()},
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/bayes_tables.log",
    benchmark:
        "results/benchmarks/bayes_tables.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/bayes_tables.py"


rule figure_bayes:
    """Bayesian-geometry figures (one job): PC scatter, explained variance over layers, key orthogonality,
    attention focusing, the Table-2 summary."""
    input:
        pc_scatter="results/summary/pc_scores.csv",
        explained_variance_layers="results/summary/domain_restriction.csv",
        key_orthogonality="results/summary/key_orthogonality.csv",
        attention_focusing="results/summary/attention_focusing.csv",
        bayes_summary="results/summary/table2.csv",
        code=code("figure_bayes"),
    output:
        **{
            fig: report(f"results/figures/{fig}.png", caption=f"../report/{fig}.rst",
                        category="Bayesian geometry", subcategory="Figures")
            for fig in BAYES_FIGURES
        },
        pdf=expand("results/figures/{fig}.pdf", fig=BAYES_FIGURES),
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/figure_bayes.log",
    benchmark:
        "results/benchmarks/figure_bayes.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_bayes.py"


rule figure_lsm:
    """LSM figures (one job): intrinsic dimension, curvature, margin histogram, expressibility gap, margin
    vs perplexity."""
    input:
        intrinsic_dimension="results/summary/intrinsic_dimension.csv",
        curvature="results/summary/curvature.csv",
        hist="results/summary/margin_histogram.csv",
        margins="results/summary/margins.csv",
        curve="results/summary/eta_curve.csv",
        fit="results/summary/expressibility_gap.csv",
        mvp="results/summary/margin_vs_perplexity.csv",
        code=code("figure_lsm"),
    output:
        intrinsic_dimension=report("results/figures/intrinsic_dimension.png",
                                   caption="../report/intrinsic_dimension.rst", category="Latent semantic manifolds"),
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
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/figure_lsm.log",
    benchmark:
        "results/benchmarks/figure_lsm.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_lsm.py"


# Scaling study: results/summary/scaling.csv (every per-model statistic of llmgeom.analyses.scaling
# .STATISTICS beside model size, the twin's value and the papers' models), read from the cross-model tables above;
# one figure per statistic against the parameter count and an overview grid. Code: llmgeom.analyses.scaling,
# llmgeom.weights.model_size (parameter counts from each model's config), llmgeom.plots.scaling.
from llmgeom.analyses.scaling import STATISTICS as SCALING_STATISTICS, TABLES as SCALING_TABLES  # no numpy at DAG time

SCALING_STATS = [s.name for s in SCALING_STATISTICS]
TARGETS += ["results/summary/scaling.csv"] + expand("results/figures/scaling.{ext}", ext=["png", "pdf"])
TARGETS += expand("results/figures/scaling/{stat}.png", stat=SCALING_STATS)


rule scaling:
    """results/summary/scaling.csv: per statistic and model (trained, twin, published) the value with its interval,
    the twin's value, the published value and the model's total / non-embedding parameters, d_model and layers."""
    input:
        unpack(scaling_tables),
        models=expand("resources/models/{model}", model=MODELS),
        code=code("scaling"),
    output:
        csv=report("results/summary/scaling.csv", caption="../report/scaling.rst", category="Scaling",
                   labels={"table": "scaling (csv)"}),
    params:
        tables=SCALING_TABLES,
        models=MODELS,
        nulls={n: e["null_of"] for n, e in NULLS.items() if e["kind"] == "random_init"},
    resources:
        mem_mb=scaled_mem(2000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/scaling.log",
    benchmark:
        "results/benchmarks/scaling.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/scaling.py"


rule figure_scaling:
    """One figure per scaling statistic against the parameter count (this run, the twins, the papers' models) and
    the overview grid."""
    input:
        csv="results/summary/scaling.csv",
        code=code("figure_scaling"),
    output:
        overview=report("results/figures/scaling.png", caption="../report/scaling.rst", category="Scaling",
                        labels={"figure": "overview"}),
        pdf="results/figures/scaling.pdf",
        **{s: report(f"results/figures/scaling/{s}.png", caption="../report/scaling.rst", category="Scaling",
                     labels={"figure": s}) for s in SCALING_STATS},
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/figure_scaling.log",
    benchmark:
        "results/benchmarks/figure_scaling.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_scaling.py"


# Claims scorecard: every claim of llmgeom/data/claims.yaml decided on the cross-model tables this
# run produces; a claim whose table is not produced is "not testable here". Code: llmgeom.analyses.claims.
from llmgeom.core.claims_data import load_claims  # yaml only: light at DAG time

CLAIM_TABLES = sorted({c["table"] for c in load_claims()})
TARGETS += expand("results/summary/claims.{ext}", ext=["csv", "md", "html"]) + ["results/summary/published.csv"]
CLAIMS_CATEGORY = "0 Claims: what this run found"  # sorts first among the report's categories


rule claims:
    """Claims scorecard: results/summary/claims.csv (claim x model: measured value and interval, published
    value and its models, verdict and reason), its Markdown / HTML rendering, and published.csv (every entry of
    llmgeom/data/published.yaml)."""
    input:
        unpack(claim_tables),
        claims_data=claims_data_input(),  # editing a claim reruns the scorecard
        code=code("claims"),
    output:
        csv=report("results/summary/claims.csv", caption="../report/claims.rst", category=CLAIMS_CATEGORY,
                   labels={"table": "claims (csv)"}),
        md="results/summary/claims.md",
        html=report("results/summary/claims.html", caption="../report/claims.rst", category=CLAIMS_CATEGORY,
                    labels={"table": "claims scorecard"}),
        published=report("results/summary/published.csv", caption="../report/claims.rst",
                         category=CLAIMS_CATEGORY, labels={"table": "published values (all entries)"}),
    params:
        tables=CLAIM_TABLES,
        models=MODELS + WT_FINALS,
        nulls={n: e["null_of"] for n, e in NULLS.items()},  # null model -> trained model
        null_for=NULL_OF,  # trained model (and wind-tunnel checkpoint) -> its null
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/claims.log",
    benchmark:
        "results/benchmarks/claims.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/claims.py"


# Headline reference: results/summary/drift.csv sets this run's headline values (llmgeom.analyses.drift
# .HEADLINE_STATISTICS of scaling.csv, per model and twin, and every verdict of claims.csv) beside the committed
# reference of the study (config key reference.path), each with its tolerance. Drift never fails the run: the front
# page shows it; the tiny study's test fails on it. A reference file that does not exist yet: every row is reported
# as without a reference (write it: docs/testing.md, "Headline reference").
REFERENCE = (config.get("reference") or {}).get("path") or ""
if REFERENCE:
    TARGETS += ["results/summary/drift.csv"]

    rule drift:
        """results/summary/drift.csv: statistic, model, reference, value, tolerance, tolerance_source, within, note."""
        input:
            scaling="results/summary/scaling.csv",
            claims="results/summary/claims.csv",
            **({"reference": REFERENCE} if os.path.isfile(REFERENCE) else {}),  # editing it reruns the check
            code=code("drift"),
        output:
            csv="results/summary/drift.csv",
        params:
            reference=lambda w: REFERENCE,  # named in the notes also when the file does not exist yet
        resources:
            mem_mb=scaled_mem(1000),
            runtime=5,
        group:
            "summary"
        log:
            "logs/drift.log",
        benchmark:
            "results/benchmarks/drift.tsv",
        conda:
            "../../envs/analysis.yaml"
        script:
            "../scripts/drift.py"


# The answer on one screen: results/index.html (headline counts, the claims x models verdict
# matrix, the forest plots); README and the report's landing page point to it. Code: llmgeom.plots.claims.
TARGETS += ["results/index.html"]


rule findings:
    """Front page results/index.html: the headline values outside their reference's tolerance (drift.csv), the headline counts of specific findings / not supported / inconclusive /
    not testable, the claims x models verdict matrix (an HTML table: every model beside its twin), one forest plot
    per numeric claim and the scaling figures."""
    input:
        card="results/summary/claims.csv",
        scaling=expand("results/figures/scaling/{stat}.png", stat=SCALING_STATS),
        **({"drift": "results/summary/drift.csv"} if REFERENCE else {}),  # drifted headline values first
        code=code("findings"),
    output:
        page="results/index.html",
        matrix=report("results/figures/claims_matrix.png", caption="../report/findings.rst",
                      category=CLAIMS_CATEGORY, labels={"figure": "verdict matrix"}),
        forest=report("results/figures/claims_forest.png", caption="../report/findings.rst",
                      category=CLAIMS_CATEGORY, labels={"figure": "forest plots"}),
        pdf=expand("results/figures/claims_{fig}.pdf", fig=["matrix", "forest"]),
    params:
        reference=REFERENCE,
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/findings.log",
    benchmark:
        "results/benchmarks/findings.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/findings.py"
