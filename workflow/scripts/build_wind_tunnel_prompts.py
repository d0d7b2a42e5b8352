"""Rule build_wind_tunnel_prompts: held-out sequences of one task cut at the answer positions, with the exact
posterior entropy (bits), the exact posterior and the candidate token ids in each prompt's meta."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    from llmgeom.prompts.io import write_prompt_set
    from llmgeom.prompts.wind_tunnel import prompt_records
    from llmgeom.pipeline.schema import call_with_config

    p = snakemake.params
    records = call_with_config(prompt_records, p.cfg, dict(p.task), cut_positions=p.cut_positions,
                               name=snakemake.wildcards.task)
    sha = write_prompt_set(records, snakemake.output[0])
    print(f"{len(records)} prompts ({p.cfg['n_sequences']} sequences x {len(p.cut_positions)} cuts), sha256 {sha}")
