# Causal interventions on the entropy axis of the value vectors during SULA (Paper III sec. 4.5-4.6).
# Code: llmgeom.interventions (axes, edits, runner; GPU rule), llmgeom.analyses.interventions (table),
# llmgeom.plots.sula (figure).
IV = config["interventions"]

summarize("sula_interventions", family="sula", folder="interventions", nulls=True)
TARGETS += expand("results/{model}/interventions/sula_interventions.csv", model=MODELS)
TARGETS += expand("results/figures/sula_interventions.{ext}", ext=["png", "pdf"])


rule intervene:
    """GPU rule: fit entropy axes on the SULA main values, run the unedited model and every edit."""
    input:
        model="resources/models/{model}",
        prompts=lambda wc: sula_prompts(wc, "main"),  # a twin: its trained model's file
        h5="results/{model}/activations/sula_main.h5",
        code=code("intervene"),
    output:
        per_prompt="results/{model}/interventions/sula_interventions_per_prompt.csv",
        axes="results/{model}/interventions/entropy_axes.csv",
        vectors="results/{model}/interventions/entropy_axes.npz",
    params:
        cfg=section_cfg("interventions", "llmgeom.interventions.runner:intervention_experiment"),
        edits=get_iv_edits,
        dtype=get_dtype,
        device_map=get_device_map,
        device=config["extract"]["device"],
    threads: GPU_THREADS
    resources:
        **GPU_RESOURCES,
    log:
        "logs/intervene/{model}.log",
    benchmark:
        "results/benchmarks/intervene/{model}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/intervene.py"


rule sula_interventions:
    """Per condition: SULA MAE / r and axis-entropy correlation after the edit, changes vs the unedited
    model with paired bootstrap CIs over prompts."""
    input:
        per_prompt="results/{model}/interventions/sula_interventions_per_prompt.csv",
        axes="results/{model}/interventions/entropy_axes.csv",
        code=code("sula_interventions"),
    output:
        "results/{model}/interventions/sula_interventions.csv",
    params:
        cfg=section_cfg("interventions", "llmgeom.analyses.interventions:intervention_summary"),
        n_boot=get_iv_n_boot,
    resources:
        mem_mb=scaled_mem(2000),
        runtime=10,
    group:
        "analysis"
    log:
        "logs/sula_interventions/{model}.log",
    benchmark:
        "results/benchmarks/sula_interventions/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/sula_interventions.py"


rule figure_interventions:
    """Grouped bars: change in axis-entropy correlation and in SULA MAE, entropy vs random axis, 95% CIs."""
    input:
        table="results/summary/sula_interventions.csv",
        code=code("figure_interventions"),
    output:
        png=report(
            "results/figures/sula_interventions.png",
            caption="../report/sula_interventions.rst",
            category="Bayesian geometry",
        ),
        pdf="results/figures/sula_interventions.pdf",
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/figure_interventions.log",
    benchmark:
        "results/benchmarks/figure_interventions.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_interventions.py"
