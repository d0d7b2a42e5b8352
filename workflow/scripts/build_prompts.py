from llmgeom.pipeline.jobs import run_logged
from llmgeom.prompts.builders import build_prompt_set
from llmgeom.prompts.io import write_prompt_set
from llmgeom.prompts.sources import wiki_cleaning_report

with run_logged(snakemake.log[0]):
    spec = dict(snakemake.params.spec)
    records = build_prompt_set(
        spec["kind"],
        n=spec["n"],
        seed=snakemake.params.seed,  # the set's own seed / token_budget, else the prompts section's
        token_budget=snakemake.params.token_budget,
        topics=spec.get("topics"),
        path=spec.get("path"),
    )
    if spec["kind"] != "code" and not spec.get("path"):
        rep = wiki_cleaning_report()
        print(f"Wikipedia summaries: {rep['n_summaries']} usable; {rep['n_cut']} cut before a sentence with an "
              f"invisible format character or an emptied formula slot, {rep['n_dropped']} dropped (nothing left); "
              f"by reason: {rep['by_reason']}")
    sha = write_prompt_set(records, snakemake.output[0])
    print(f"{len(records)} prompts, sha256 {sha}")
