# Rule intervene: entropy-axis edits during SULA (Paper III sec. 4.5-4.6). The forward passes run in the
# model's server process (weights loaded once per allocation; issue 13), or here with LLMGEOM_MODEL_SERVER=0.
from typing import TYPE_CHECKING

from llmgeom.pipeline.model_server import run_task

if TYPE_CHECKING:  # the code this job runs (in the server), named for code tracking (common.smk code())
    import llmgeom.interventions.runner  # noqa: F401

p = snakemake.params
load = dict(model_dir=snakemake.input.model, dtype=p.dtype, device=p.device, device_map=p.device_map)
per_prompt, axes, arrays = run_task(
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
)
from llmgeom.core.io import write_table
from llmgeom.interventions.runner import save_axes

write_table(per_prompt, snakemake.output.per_prompt)
write_table(axes, snakemake.output.axes)
save_axes(arrays, snakemake.output.vectors)
with open(snakemake.log[0], "a") as fh:
    fh.write(axes.to_string(index=False) + "\n")
