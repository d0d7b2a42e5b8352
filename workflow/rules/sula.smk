# SULA in-context inference with exact Bayesian posteriors and its controls (Paper III sec. 4.3 / 5.2).
# Prompts depend on the tokenizer (single-token labels), so they are built per model. Code:
# llmgeom.prompts.sula (prompts), llmgeom.analyses.sula (tables), llmgeom.plots.sula (figures).
SULA = config["sula"]
SULA_CONDITIONS = list(SULA["conditions"])
SULA_TABLES = ["sula", "sula_calibration", "sula_geometry", "sula_prompts"]

summarize(*SULA_TABLES, family="sula", nulls=True)
TARGETS += expand("results/{model}/tables/{table}.csv", model=MODELS, table=SULA_TABLES)
TARGETS += expand("results/figures/{fig}.{ext}", fig=["sula_calibration", "sula_pc1"], ext=["png", "pdf"])


rule build_sula:
    """Per-model SULA prompt sets (main + controls) with single-token nonsense labels, seeded."""
    input:
        model="resources/models/{model}",
        code=code("build_sula"),
    output:
        expand("resources/prompts/sula/{{model}}/{condition}.jsonl", condition=SULA_CONDITIONS),
    params:
        cfg=section_cfg("sula", "llmgeom.prompts.sula:build_sula_sets"),
        conditions=SULA_CONDITIONS,
    priority: PRIORITY["build_sula"]
    resources:
        mem_mb=scaled_mem(2000),
        runtime=5,
    log:
        "logs/build_sula/{model}.log",
    benchmark:
        "results/benchmarks/build_sula/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/build_sula.py"


rule extract_sula:
    """GPU rule: activations + label log-probabilities of one SULA condition -> HDF5 (contract + candidates)."""
    input:
        model="resources/models/{model}",
        prompts=sula_prompts,  # a twin: its trained model's file
        code=code("extract"),
    output:
        "results/{model}/activations/sula_{condition}.h5",
    wildcard_constraints:
        condition="|".join(SULA_CONDITIONS),
    params:
        cfg=section_cfg("extract"),
        dtype=get_dtype,
        batch_size=get_sula_batch_size,
        device_map=get_device_map,
        attention=False,  # SULA needs no attention weights: sdpa
        corpus=False,
        candidates_key=CANDIDATES_KEY,
        max_tokens=None,  # not a corpus set: no prompt is cut
        seed=config["sula"]["seed"],  # the seed the SULA prompts were drawn with
    threads: GPU_THREADS
    resources:
        **GPU_RESOURCES,
    log:
        "logs/extract_sula/{model}/{condition}.log",
    benchmark:
        "results/benchmarks/extract_sula/{model}/{condition}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/extract.py"


rule sula:
    """SULA MAE / r per condition and k (sula.csv), calibration bins, PC1 geometry per layer, per-prompt values."""
    input:
        h5=lambda w: expand("results/{model}/activations/sula_{condition}.h5", model=w.model,
                            condition=get_sula_conditions(w)),
        code=code("sula"),
    output:
        sula="results/{model}/tables/sula.csv",
        calibration="results/{model}/tables/sula_calibration.csv",
        geometry="results/{model}/tables/sula_geometry.csv",
        prompts="results/{model}/tables/sula_prompts.csv",
    params:
        cfg=section_cfg("sula", "llmgeom.analyses.sula:sula_tables"),
        conditions=get_sula_conditions,
    resources:
        mem_mb=scaled_mem(2000),
        runtime=10,
    group:
        "analysis"
    log:
        "logs/sula/{model}.log",
    benchmark:
        "results/benchmarks/sula/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/sula.py"


rule figure_sula:
    """H_model vs H_Bayes per k (identity line) per model and condition; PC1 vs k and rho across depth."""
    input:
        sula="results/summary/sula.csv",
        prompts="results/summary/sula_prompts.csv",
        geometry="results/summary/sula_geometry.csv",
        code=code("figure_sula"),
    output:
        calibration=report(
            "results/figures/sula_calibration.png",
            caption="../report/sula_calibration.rst",
            category="Bayesian geometry",
        ),
        calibration_pdf="results/figures/sula_calibration.pdf",
        pc1=report(
            "results/figures/sula_pc1.png",
            caption="../report/sula_pc1.rst",
            category="Bayesian geometry",
        ),
        pc1_pdf="results/figures/sula_pc1.pdf",
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/figure_sula.log",
    benchmark:
        "results/benchmarks/figure_sula.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_sula.py"
