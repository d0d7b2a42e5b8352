# Wind tunnel (Papers I-III): small transformers trained on tasks with exact posteriors, measured by the
# same rules as the LLMs. Model entries: WT_MODELS (common.smk; finals and their checkpoints <name>-step<k>), kept
# out of MODELS (no Wikipedia, SULA or LSM extraction). Code: llmgeom.prompts.wind_tunnel (tasks, prompt records),
# llmgeom.measures.bayes (exact posteriors), llmgeom.wind_tunnel.train (training), llmgeom.analyses.wind_tunnel
# (tables), llmgeom.plots.wind_tunnel (figure).
WT_TABLES = ["wind_tunnel", "wind_tunnel_calibration", "wind_tunnel_geometry", "wind_tunnel_prompts"]


if WT_MODELS:
    summarize(*WT_TABLES, family="wind_tunnel", models=WT_MODELS)
    TARGETS += expand("results/{model}/tables/{table}.csv", model=WT_MODELS,
                      table=WT_TABLES + ["key_orthogonality", "attention_focusing", "attention_focusing_summary"])
    TARGETS += expand("results/figures/wind_tunnel.{ext}", ext=["png", "pdf"])


rule train_wind_tunnel:
    """GPU rule: train one wind-tunnel model (seeded; deterministic on CPU) -> plain HF directory + manifest +
    training_log.csv; checkpoints under resources/wind_tunnel/{model}/."""
    input:
        code=code("train_wind_tunnel"),
    output:
        model=directory("resources/models/{model}"),
        checkpoints=directory("resources/wind_tunnel/{model}"),
    wildcard_constraints:
        model=WT_FINAL_RE,
    params:
        task=get_wt_task,
        arch=get_wt_arch,
        training=get_wt_training,
        checkpoints=get_wt_checkpoints,
    threads: get_wt_threads
    resources:
        **GPU_RESOURCES,
    log:
        "logs/train_wind_tunnel/{model}.log",
    benchmark:
        "results/benchmarks/train_wind_tunnel/{model}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/train_wind_tunnel.py"


rule wind_tunnel_checkpoint:
    """A training checkpoint of rule train_wind_tunnel -> its own model entry resources/models/{name}-step{k}."""
    input:
        run=lambda w: f"resources/wind_tunnel/{WT[w.model]['base']}",
        code=code("wind_tunnel_checkpoint"),
    output:
        directory("resources/models/{model}"),
    wildcard_constraints:
        model=WT_CHECKPOINT_RE,
    params:
        base=get_wt_base,
    priority: PRIORITY["wind_tunnel_checkpoint"]
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    log:
        "logs/wind_tunnel_checkpoint/{model}.log",
    benchmark:
        "results/benchmarks/wind_tunnel_checkpoint/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/wind_tunnel_checkpoint.py"


rule build_wind_tunnel_prompts:
    """Held-out sequences of one task cut at the answer positions; exact entropy, posterior, candidate ids in meta."""
    input:
        code=code("build_wind_tunnel_prompts"),
    output:
        "resources/prompts/wind_tunnel/{task}.jsonl",
    wildcard_constraints:
        task=_re(WT_TASKS),
    params:
        cfg=section_cfg("wind_tunnel.prompts"),
        task=get_task_spec,
        cut_positions=get_wt_cuts,
    priority: PRIORITY["build_wind_tunnel_prompts"]
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    log:
        "logs/build_wind_tunnel_prompts/{task}.log",
    benchmark:
        "results/benchmarks/build_wind_tunnel_prompts/{task}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/build_wind_tunnel_prompts.py"


rule extract_wind_tunnel:
    """GPU rule: activations + candidate log-probabilities of a wind-tunnel model on its task's prompt set."""
    input:
        model="resources/models/{model}",
        prompts=lambda w: f"resources/prompts/wind_tunnel/{WT[w.model]['task']}.jsonl",
        code=code("extract"),
    output:
        "results/{model}/activations/wind_tunnel.h5",
    wildcard_constraints:
        model=WT_ALL_RE,
    params:
        cfg=section_cfg("extract"),
        dtype="float32",
        batch_size=get_batch_size,
        device_map=None,
        attention=True,  # attention entropies for attention focusing
        corpus=False,
        candidates_key=CANDIDATES_KEY,
        max_tokens=None,  # not a corpus set: no prompt is cut
        seed=config["wind_tunnel"]["prompts"]["seed"],  # the seed the task's sequences were drawn with
    threads: GPU_THREADS
    resources:
        **GPU_RESOURCES,
    log:
        "logs/extract_wind_tunnel/{model}.log",
    benchmark:
        "results/benchmarks/extract_wind_tunnel/{model}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/extract.py"


rule wind_tunnel:
    """Calibration (MAE bits with a bootstrap interval over held-out sequences, wind_tunnel.n_boot / ci / seed;
    Pearson / Spearman vs the exact entropy; per t and overall), calibration bins, and PC1 geometry per layer of
    values / attention output / residual stream."""
    input:
        h5="results/{model}/activations/wind_tunnel.h5",
        code=code("wind_tunnel"),
    output:
        summary="results/{model}/tables/wind_tunnel.csv",
        calibration="results/{model}/tables/wind_tunnel_calibration.csv",
        geometry="results/{model}/tables/wind_tunnel_geometry.csv",
        prompts="results/{model}/tables/wind_tunnel_prompts.csv",
    wildcard_constraints:
        model=WT_ALL_RE,
    params:
        cfg=section_cfg("wind_tunnel"),
        step=get_wt_step,
    threads: 1
    resources:
        mem_mb=scaled_mem(2000),
        runtime=10,
    group:
        "analysis"
    log:
        "logs/wind_tunnel/{model}.log",
    benchmark:
        "results/benchmarks/wind_tunnel/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/wind_tunnel.py"


rule figure_wind_tunnel:
    """Wind-tunnel figure: model vs exact entropy per model, and |rho(PC1, exact entropy)| over depth per
    representation."""
    input:
        prompts="results/summary/wind_tunnel_prompts.csv",
        summary="results/summary/wind_tunnel.csv",
        geometry="results/summary/wind_tunnel_geometry.csv",
        code=code("figure_wind_tunnel"),
    output:
        png=report("results/figures/wind_tunnel.png", caption="../report/wind_tunnel.rst", category="Wind tunnel"),
        pdf="results/figures/wind_tunnel.pdf",
    params:
        finals=WT_FINALS,
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/figure_wind_tunnel.log",
    benchmark:
        "results/benchmarks/figure_wind_tunnel.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/figure_wind_tunnel.py"
