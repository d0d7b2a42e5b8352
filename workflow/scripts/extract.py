# Rules extract and extract_sula: one model, one prompt set -> HDF5 activations (DESIGN.md section 2).
# The work runs in the model's server process (weights loaded once per allocation), or here
# with LLMGEOM_MODEL_SERVER=0.
from typing import TYPE_CHECKING

from llmgeom.pipeline.model_server import run_task

if TYPE_CHECKING:  # the code this job runs (in the server), named for code tracking (common.smk code())
    import llmgeom.extract.forward  # noqa: F401

p = snakemake.params
load = dict(model_dir=snakemake.input.model, dtype=p.dtype, device=p.cfg["device"], device_map=p.device_map)
run_task(
    "extract",
    dict(
        cfg=p.cfg,  # the config section extract (top_k, sample_per_prompt, device); the rest is derived per model
        model_dir=snakemake.input.model,
        prompts_path=snakemake.input.prompts,
        out_path=snakemake.output[0],
        model_name=snakemake.wildcards.model,
        dtype=p.dtype,
        device_map=p.device_map,
        batch_size=p.batch_size,
        attention=p.attention,
        corpus=p.corpus,
        candidates_key=p.candidates_key,
        max_tokens=p.max_tokens,
        seed=p.seed,
        mem_mb=getattr(snakemake.resources, "mem_mb", None),  # checked against the model's size before loading
    ),
    load=load,
    log=snakemake.log[0],
    threads=snakemake.threads,
)
