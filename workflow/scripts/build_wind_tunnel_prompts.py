"""Rule build_wind_tunnel_prompts: held-out sequences of one task cut at the answer positions, with the exact
posterior entropy (bits), the exact posterior and the candidate token ids in each prompt's meta."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    from llmgeom.prompts.io import write_prompt_set
    from llmgeom.prompts.wind_tunnel import prompt_records

    p = snakemake.params
    records = prompt_records(dict(p.task), n_sequences=p.n_sequences, cut_positions=p.cut_positions, seed=p.seed,
                             name=snakemake.wildcards.task)
    sha = write_prompt_set(records, snakemake.output[0])
    print(f"{len(records)} prompts ({p.n_sequences} sequences x {len(p.cut_positions)} cuts), sha256 {sha}")
