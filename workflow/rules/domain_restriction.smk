# Domain restriction (Paper III sec. 4): entropy-stratified mixed vs single-topic selections and the
# value-manifold statistics of each. Code: llmgeom.analyses.domain_restriction. Definitions: DESIGN.md sec. 3.
from llmgeom.pipeline.derived import resolve_domain_sets  # light: no numpy/pandas at DAG time

DR = resolve_domain_sets(config)  # checked in common.smk (checks.check_domain_restriction)
DR_SETS = [DR["mixed"], *DR["restricted"]]

summarize("domain_restriction", "domain_selection", "pc_scores", family="bayes", nulls=True)


rule domain_restriction:
    """Paper III sec. 4: entropy-stratified selections (mixed vs single-topic), value-manifold stats per layer."""
    input:
        h5=lambda w: expand("results/{model}/activations/{promptset}.h5", model=w.model, promptset=get_dr_sets(w)),
        code=code("domain_restriction"),
    output:
        stats="results/{model}/tables/domain_restriction.csv",
        selection="results/{model}/tables/domain_selection.csv",
        scores="results/{model}/tables/pc_scores.csv",
    params:
        cfg=section_cfg("domain_restriction"),
        prompt_sets=get_dr_sets,
        mixed_set=DR["mixed"],
        labels=DR["labels"],
        n_boot=get_dr_n_boot,
        data_reps=config["nulls"]["data_reps"],
    threads: 1
    priority: PRIORITY["domain_restriction"]
    resources:
        mem_mb=scaled_mem(4000),
        runtime=30,
    group:
        "analysis"
    log:
        "logs/domain_restriction/{model}.log",
    benchmark:
        "results/benchmarks/domain_restriction/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/domain_restriction.py"
