from llmgeom.workflow_support import run_logged, set_threads

with run_logged(snakemake.log[0], threads=snakemake.threads):
    set_threads(snakemake.threads)
    from llmgeom.extraction import extract_to_hdf5
    from llmgeom.sula import CANDIDATES_KEY

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
        attention=False,  # SULA needs no attention weights: sdpa
        candidates_key=CANDIDATES_KEY,
    )
