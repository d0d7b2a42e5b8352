# Bayesian geometry at scale (Paper III): domain restriction, key orthogonality, attention focusing,
# cross-model Table-1 / Table-2 analogues and their figures. Definitions: DESIGN.md sec. 3.
from llmgeom.workflow.config import check_bayes_config, resolve_domain_sets  # light: no numpy/pandas at DAG time

check_bayes_config(config)
_DR = resolve_domain_sets(config)
DR_SETS = [_DR["mixed"], *_DR["restricted"]]
AF_SET = config["attention_focusing"]["prompt_set"]
BAYES_MODEL_TABLES = ["domain_restriction", "domain_selection", "pc_scores", "key_orthogonality",
                      "attention_focusing", "attention_focusing_summary"]
BAYES_FIGURES = ["pc_scatter", "explained_variance_layers", "key_orthogonality", "attention_focusing",
                 "bayes_summary"]

TARGETS += expand("results/summary/{table}.csv", table=BAYES_MODEL_TABLES)
TARGETS += expand("results/summary/{t}.{ext}", t=["table1", "table2"], ext=["csv", "md"])
TARGETS += ["results/summary/bayes_tables.html"]
TARGETS += expand("results/figures/{fig}.{ext}", fig=BAYES_FIGURES, ext=["png", "pdf"])


rule domain_restriction:
    """Paper III sec. 4: entropy-stratified selections (mixed vs single-topic), value-manifold stats per layer."""
    input:
        h5=expand("results/{{model}}/activations/{promptset}.h5", promptset=DR_SETS),
        code=code("domain_restriction"),
    output:
        stats="results/{model}/tables/domain_restriction.csv",
        selection="results/{model}/tables/domain_selection.csv",
        scores="results/{model}/tables/pc_scores.csv",
    params:
        prompt_sets=DR_SETS,
        mixed_set=_DR["mixed"],
        labels=_DR["labels"],
        n_quantiles=config["domain_restriction"]["n_quantiles"],
        per_quantile=config["domain_restriction"]["per_quantile"],
        edges=config["domain_restriction"]["edges"],
        n_boot=config["domain_restriction"]["n_boot"],
        ci=config["domain_restriction"]["ci"],
        seed=config["domain_restriction"]["seed"],
        layers=config["domain_restriction"]["layers"],
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    group:
        "analysis"
    log:
        "logs/domain_restriction/{model}.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/domain_restriction.py"


rule key_orthogonality:
    """Paper III sec. 4.2: mean |cos| between W_K columns per layer and key head, Gaussian and random-init baselines."""
    input:
        model="resources/models/{model}",
        code=code("key_orthogonality"),
    output:
        "results/{model}/tables/key_orthogonality.csv",
    params:
        seed=config["key_orthogonality"]["seed"],
        random_init=config["key_orthogonality"]["random_init"],
        dtype=lambda w: mcfg(w, "dtype"),
    threads: 1
    resources:
        mem_mb=lambda w: mcfg(w, "mem_mb"),
        runtime=30,
    group:
        "analysis"
    log:
        "logs/key_orthogonality/{model}.log",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/key_orthogonality.py"


rule attention_focusing:
    """Paper III sec. 4.2: final-query attention entropy per head and layer; focusing first -> last layer."""
    input:
        h5=f"results/{{model}}/activations/{AF_SET}.h5",
        code=code("attention_focusing"),
    output:
        detail="results/{model}/tables/attention_focusing.csv",
        summary="results/{model}/tables/attention_focusing_summary.csv",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    group:
        "analysis"
    log:
        "logs/attention_focusing/{model}.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/attention_focusing.py"


rule aggregate_bayes:
    """Cross-model Bayesian-geometry tables: each per-model table concatenated over models (one job)."""
    input:
        expand("results/{model}/tables/{table}.csv", table=BAYES_MODEL_TABLES, model=MODELS),
        code=code("aggregate_bayes"),
    output:
        **{
            t: report(
                f"results/summary/{t}.csv",
                caption="../report/bayes_table.rst",
                category="Bayesian geometry",
                subcategory="Tables",
                labels={"table": t},
            )
            for t in BAYES_MODEL_TABLES
        },
    params:
        tables=BAYES_MODEL_TABLES,
        models=MODELS,
    resources:
        mem_mb=2000,
        runtime=5,
    group:
        "summary"
    log:
        "logs/aggregate_bayes.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/aggregate_bayes.py"


rule bayes_summary:
    """Table-1 and Table-2 analogues of Paper III across models: CSV, Markdown and an HTML rendering."""
    input:
        dr="results/summary/domain_restriction.csv",
        ko="results/summary/key_orthogonality.csv",
        af="results/summary/attention_focusing_summary.csv",
        code=code("bayes_summary"),
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
        restricted_set=_DR["summary"],
    resources:
        mem_mb=1000,
        runtime=5,
    group:
        "summary"
    log:
        "logs/bayes_summary.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/bayes_summary.py"


rule figure_pc_scatter:
    input:
        "results/summary/pc_scores.csv",
        code=code("figure_bayes"),
    output:
        png=report("results/figures/pc_scatter.png", caption="../report/pc_scatter.rst",
                   category="Bayesian geometry", subcategory="Figures"),
        pdf="results/figures/pc_scatter.pdf",
    params:
        kind="pc_scatter",
    resources:
        mem_mb=1000,
        runtime=5,
    group:
        "summary"
    log:
        "logs/figures/pc_scatter.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_bayes.py"


rule figure_explained_variance_layers:
    input:
        "results/summary/domain_restriction.csv",
        code=code("figure_bayes"),
    output:
        png=report("results/figures/explained_variance_layers.png", caption="../report/explained_variance_layers.rst",
                   category="Bayesian geometry", subcategory="Figures"),
        pdf="results/figures/explained_variance_layers.pdf",
    params:
        kind="explained_variance_layers",
    resources:
        mem_mb=1000,
        runtime=5,
    group:
        "summary"
    log:
        "logs/figures/explained_variance_layers.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_bayes.py"


rule figure_key_orthogonality:
    input:
        "results/summary/key_orthogonality.csv",
        code=code("figure_bayes"),
    output:
        png=report("results/figures/key_orthogonality.png", caption="../report/key_orthogonality.rst",
                   category="Bayesian geometry", subcategory="Figures"),
        pdf="results/figures/key_orthogonality.pdf",
    params:
        kind="key_orthogonality",
    resources:
        mem_mb=1000,
        runtime=5,
    group:
        "summary"
    log:
        "logs/figures/key_orthogonality.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_bayes.py"


rule figure_attention_focusing:
    input:
        "results/summary/attention_focusing.csv",
        code=code("figure_bayes"),
    output:
        png=report("results/figures/attention_focusing.png", caption="../report/attention_focusing.rst",
                   category="Bayesian geometry", subcategory="Figures"),
        pdf="results/figures/attention_focusing.pdf",
    params:
        kind="attention_focusing",
    resources:
        mem_mb=1000,
        runtime=5,
    group:
        "summary"
    log:
        "logs/figures/attention_focusing.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_bayes.py"


rule figure_bayes_summary:
    input:
        "results/summary/table2.csv",
        code=code("figure_bayes"),
    output:
        png=report("results/figures/bayes_summary.png", caption="../report/bayes_summary.rst",
                   category="Bayesian geometry", subcategory="Figures"),
        pdf="results/figures/bayes_summary.pdf",
    params:
        kind="bayes_summary",
    resources:
        mem_mb=1000,
        runtime=5,
    group:
        "summary"
    log:
        "logs/figures/bayes_summary.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_bayes.py"
