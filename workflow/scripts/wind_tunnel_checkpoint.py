"""Rule wind_tunnel_checkpoint: a training checkpoint -> its model entry resources/models/{model}-step{k}."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    import shutil
    from pathlib import Path

    from llmgeom.core.io import atomic_dir, commit_dir

    src = Path(snakemake.input.run) / f"{snakemake.wildcards.model}"
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: checkpoint missing from the training run; rerun rule train_wind_tunnel "
                                f"for {snakemake.params.base}")
    tmp = atomic_dir(snakemake.output[0])
    shutil.copytree(src, tmp, dirs_exist_ok=True)
    commit_dir(tmp, snakemake.output[0])
    print(f"{src} -> {snakemake.output[0]}")
