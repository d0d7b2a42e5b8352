from llmgeom.workflow_support import run_logged, set_threads

with run_logged(snakemake.log[0], threads=snakemake.threads):
    set_threads(snakemake.threads)
    from llmgeom.extraction import extract_to_hdf5

    p = snakemake.params
    extract_to_hdf5(
        snakemake.input.model,
        snakemake.input.prompts,
        snakemake.output[0],
        model_name=snakemake.wildcards.model,
        dtype=p.dtype,
        device=p.device,
        device_map=p.device_map,
        batch_size=p.batch_size,
        top_k=p.top_k,
        attention=not p.corpus,
        corpus=p.corpus,
        sample_per_prompt=p.sample_per_prompt,
        max_tokens=p.max_tokens,
        seed=p.seed,
        mem_mb=getattr(snakemake.resources, "mem_mb", None),  # checked against the model's size before loading
    )
