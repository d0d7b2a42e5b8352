from pathlib import Path

from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    from llmgeom.pipeline import provenance

    p = snakemake.params
    rec = provenance.collect(snakemake.config, models=p.models, prompt_sets=p.prompt_sets, root=".",
                             workflow_dir=Path(snakemake.scriptdir).parents[1])
    assert rec["config_sha256"] == p.config_sha256
    provenance.write(rec, snakemake.output.json, snakemake.output.md)
    print(f"config sha256 {rec['config_sha256']}; {len(rec['models'])} models, {len(rec['prompt_sets'])} prompt sets"
          + (f"; MISMATCHES: {rec['mismatches']}" if rec["mismatches"] else ""))
