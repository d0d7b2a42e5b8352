# Rule key_orthogonality: W_K column orthogonality per layer and key head, with baselines (Paper III sec. 4.2). It
# runs in the model's server process, on the weights loaded there for the extractions (no second load of the
# model), or here with LLMGEOM_MODEL_SERVER=0.
from typing import TYPE_CHECKING

from llmgeom.pipeline.model_server import run_task

if TYPE_CHECKING:  # the code this job runs (in the server), named for code tracking (common.smk code())
    import llmgeom.weights.key_orthogonality  # noqa: F401

p = snakemake.params
load = dict(model_dir=snakemake.input.model, dtype=p.dtype, device=p.device, device_map=p.device_map)
run_task(
    "key_orthogonality",
    dict(
        cfg=p.cfg,  # the config section key_orthogonality (seed, random_init)
        model_dir=snakemake.input.model,
        model_name=snakemake.wildcards.model,
        dtype=p.dtype,
        device=p.device,
        device_map=p.device_map,
        mem_mb=getattr(snakemake.resources, "mem_mb", None),  # checked against the model's size before loading
    ),
    load=load,
    log=snakemake.log[0],
    threads=snakemake.threads,
    outputs=dict(table_path=snakemake.output[0]),  # written where the task ran (a table never crosses the socket)
)
