# Rule intervene: entropy-axis edits during SULA (Paper III sec. 4.5-4.6). The forward passes run in the
# model's server process (weights loaded once per allocation), or here with LLMGEOM_MODEL_SERVER=0.
from typing import TYPE_CHECKING

from llmgeom.pipeline.model_server import run_task

if TYPE_CHECKING:  # the code this job runs (in the server), named for code tracking (common.smk code())
    import llmgeom.interventions.runner  # noqa: F401

p = snakemake.params
load = dict(model_dir=snakemake.input.model, dtype=p.dtype, device=p.device, device_map=p.device_map)
run_task(
    "intervene",
    dict(
        model_dir=snakemake.input.model,
        prompts_path=snakemake.input.prompts,
        h5_path=snakemake.input.h5,
        model_name=snakemake.wildcards.model,
        cfg=p.cfg,  # the config section interventions; edits and the model's dtype / device are derived
        edits=p.edits,
        dtype=p.dtype,
        device=p.device,
        device_map=p.device_map,
    ),
    load=load,
    log=snakemake.log[0],
    threads=snakemake.threads,
    # written where the task ran (tables and arrays never cross the server's socket)
    outputs=dict(per_prompt_path=snakemake.output.per_prompt, axes_path=snakemake.output.axes,
                 vectors_path=snakemake.output.vectors),
)
