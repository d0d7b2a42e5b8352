# Intrinsic dimension of the residual stream per layer (LSM) and the shape of its profile over depth.
# Code: llmgeom.analyses.intrinsic_dimension (tables), llmgeom.measures.intrinsic_dimension (TwoNN, MLE, GRIDE).
summarize("intrinsic_dimension", "id_profile", "id_last_token", "gride_scale", family="lsm", nulls=True)
TARGETS += expand("results/{model}/tables/{table}.csv", model=MODELS,
                  table=["intrinsic_dimension", "id_profile", "id_last_token", "gride_scale"])
# last-token ID (Cheng et al.'s points): the last_token/residual states of this prompt set, when it is configured
ID_LAST_SET = config["intrinsic_dimension"]["last_token_set"]
ID_LAST_INPUT = ({"last_token": f"results/{{model}}/activations/{ID_LAST_SET}.h5"}
                 if ID_LAST_SET in config["prompts"]["sets"] else {})


rule intrinsic_dimension:
    """LSM: intrinsic dimension (TwoNN / MLE / GRIDE) of the residual stream per layer at corpus tokens and
    of the last-token states over the prompts of a second set, GRIDE's scale curve, and the profile summary
    (peak layer, peak value, shape over relative depth, which estimators agree)."""
    input:
        unpack(lambda wc: ID_LAST_INPUT),
        h5=f"results/{{model}}/activations/{ID_SET}.h5",
        code=code("intrinsic_dimension"),
    output:
        ids="results/{model}/tables/intrinsic_dimension.csv",
        last_token="results/{model}/tables/id_last_token.csv",
        scale="results/{model}/tables/gride_scale.csv",
        profile="results/{model}/tables/id_profile.csv",
    params:
        cfg=section_cfg("intrinsic_dimension"),
    threads: 1
    priority: PRIORITY["intrinsic_dimension"]
    resources:
        mem_mb=scaled_mem(4000),
        runtime=30,
    group:
        "analysis"
    log:
        "logs/intrinsic_dimension/{model}.log",
    benchmark:
        "results/benchmarks/intrinsic_dimension/{model}.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/intrinsic_dimension.py"
