# Rules extract and extract_sula: one model, one prompt set -> HDF5 activations (DESIGN.md section 2).
from llmgeom.workflow.jobs import run_logged, set_threads

with run_logged(snakemake.log[0], threads=snakemake.threads):
    set_threads(snakemake.threads)
    from llmgeom.extract.forward import extract_to_hdf5

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
        attention=p.attention,
        corpus=p.corpus,
        candidates_key=p.candidates_key,
        sample_per_prompt=p.get("sample_per_prompt", 0),
        max_tokens=p.get("max_tokens"),
        seed=p.get("seed", 0),
        mem_mb=getattr(snakemake.resources, "mem_mb", None),  # checked against the model's size before loading
    )
