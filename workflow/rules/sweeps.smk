# Training-checkpoint sweeps: model entries whose revision is a training step ("step1000") are
# checkpoints of one run (config/pythia_checkpoints.yaml). Their cross-model summaries (one row per model)
# are joined by step, so geometry can be traced over training. Adding a checkpoint later reruns only its
# own jobs, the summaries and this table. Included last: it reads the summary targets of the other files.
from llmgeom.pipeline.sweeps import checkpoint_series, checkpoint_steps

CHECKPOINT_STEPS = checkpoint_steps(config["models"])
TRAJECTORY_TABLES = [
    t for t in ("table2", "id_profile", "margin_vs_perplexity") if f"results/summary/{t}.csv" in TARGETS
]

if len(CHECKPOINT_STEPS) >= 2 and TRAJECTORY_TABLES:
    TARGETS += ["results/summary/checkpoint_trajectory.csv"]
    TARGETS += expand("results/figures/checkpoint_trajectory.{ext}", ext=["png", "pdf"])


rule checkpoint_trajectory:
    """Every numeric column of the per-model summary tables against the training step, per checkpoint series."""
    input:
        tables=expand("results/summary/{t}.csv", t=TRAJECTORY_TABLES),
        code=code("checkpoint_trajectory"),
    output:
        table=report(
            "results/summary/checkpoint_trajectory.csv",
            caption="../report/checkpoint_trajectory.rst",
            category="Training checkpoints",
        ),
        png=report(
            "results/figures/checkpoint_trajectory.png",
            caption="../report/checkpoint_trajectory.rst",
            category="Training checkpoints",
        ),
        pdf="results/figures/checkpoint_trajectory.pdf",
    params:
        tables=TRAJECTORY_TABLES,
        steps=CHECKPOINT_STEPS,
        series=checkpoint_series(config["models"], CHECKPOINT_STEPS),
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/checkpoint_trajectory.log",
    benchmark:
        "results/benchmarks/checkpoint_trajectory.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/checkpoint_trajectory.py"
