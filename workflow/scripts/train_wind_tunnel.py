"""Rule train_wind_tunnel: one wind-tunnel model -> resources/models/{model} (+ checkpoints under
resources/wind_tunnel/{model}/, copied into place as model entries by rule wind_tunnel_checkpoint)."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0], threads=snakemake.threads):
    import os
    import shutil
    from pathlib import Path

    from llmgeom.wind_tunnel.train import LOG_FILE, train_wind_tunnel
    from llmgeom.pipeline.schema import call_with_config

    p = snakemake.params
    name = snakemake.wildcards.model
    run_dir = Path(snakemake.output.checkpoints)
    run_dir.mkdir(parents=True, exist_ok=True)
    res = call_with_config(train_wind_tunnel, p.training, dict(p.task), run_dir / name, name=name, arch=dict(p.arch),
                           checkpoints=list(p.checkpoints), threads=snakemake.threads,
                           log=lambda line: print(line, flush=True))
    # the final model goes to its model entry; the run directory keeps the checkpoints and a copy of the log
    shutil.copy2(res["model_dir"] / LOG_FILE, run_dir / LOG_FILE)
    os.replace(res["model_dir"], snakemake.output.model)
