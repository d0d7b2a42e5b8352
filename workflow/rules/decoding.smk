# Margin-adaptive decoding (LSM): NLL / top-1 ECE under T=1, one fitted T and T(m). Code: llmgeom.analyses.decoding,
# llmgeom.measures.decoding; llmgeom.weights.unembedding reads W_U (as rule fisher does).
DECODING_SET = config["decoding"]["prompt_set"]

summarize("decoding", family="lsm", nulls=True)
TARGETS += expand("results/{model}/tables/decoding.csv", model=MODELS)


rule decoding:
    """LSM: temperature schemes on held-out corpus passages, (adaptive - single) with a paired bootstrap."""
    input:
        h5=f"results/{{model}}/activations/{DECODING_SET}.h5",
        model="resources/models/{model}",
        code=code("decoding"),
    output:
        "results/{model}/tables/decoding.csv",
    params:
        cfg=section_cfg("decoding"),
    threads: config["decoding"]["threads"]
    resources:
        mem_mb=scaled_mem(model_mem),
        runtime=lambda w: mcfg(w, "runtime"),
    group:
        "analysis"
    log:
        "logs/decoding/{model}.log",
    benchmark:
        "results/benchmarks/decoding/{model}.tsv",
    conda:
        "../../envs/torch.yaml"
    script:
        "../scripts/decoding.py"
