"""Rule train_wind_tunnel: one wind-tunnel model -> resources/models/{model} (+ checkpoints under
resources/wind_tunnel/{model}/, copied into place as model entries by rule wind_tunnel_checkpoint)."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0], threads=snakemake.threads):
    import os
    import shutil
    from pathlib import Path

    from llmgeom.wind_tunnel.train import LOG_FILE, train_wind_tunnel

    p = snakemake.params
    name = snakemake.wildcards.model
    run_dir = Path(snakemake.output.checkpoints)
    run_dir.mkdir(parents=True, exist_ok=True)
    t = dict(p.training)
    res = train_wind_tunnel(dict(p.task), run_dir / name, name=name, arch=dict(p.arch), checkpoints=list(p.checkpoints),
                            threads=snakemake.threads, seed=t.pop("seed"), steps=t.pop("steps"),
                            batch_size=t.pop("batch_size"), lr=t.pop("lr"), warmup_steps=t.pop("warmup_steps"),
                            weight_decay=t.pop("weight_decay"), clip_norm=t.pop("clip_norm"),
                            log=lambda line: print(line, flush=True), **t)
    # the final model goes to its model entry; the run directory keeps the checkpoints and a copy of the log
    shutil.copy2(res["model_dir"] / LOG_FILE, run_dir / LOG_FILE)
    os.replace(res["model_dir"], snakemake.output.model)
