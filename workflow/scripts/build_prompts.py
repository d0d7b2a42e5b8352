from llmgeom.pipeline.jobs import run_logged
from llmgeom.prompts.builders import build_prompt_set
from llmgeom.prompts.io import write_prompt_set
from llmgeom.prompts.sources import wiki_cleaning_report
from llmgeom.prompts.tokens import ReferenceTokenizer

with run_logged(snakemake.log[0]):
    spec = dict(snakemake.params.spec)
    tok = ReferenceTokenizer(snakemake.input.tokenizer, snakemake.params.tokenizer)  # first: a missing one is named
    records = build_prompt_set(
        spec["kind"],
        n=spec["n"],
        seed=snakemake.params.seed,  # the set's own seed / token_budget, else the prompts section's
        token_budget=snakemake.params.token_budget,
        tokenizer=tok,
        topics=spec.get("topics"),
        path=spec.get("path"),
    )
    if spec["kind"] != "code" and not spec.get("path"):
        rep = wiki_cleaning_report()
        print(f"Wikipedia summaries: {rep['n_summaries']} usable; {rep['n_cut']} cut before a sentence with an "
              f"invisible format character or an emptied formula slot, {rep['n_dropped']} dropped (nothing left); "
              f"by reason: {rep['by_reason']}")
    sha = write_prompt_set(records, snakemake.output[0])
    n_tok = [r["meta"]["n_tokens"] for r in records]
    print(f"{len(records)} prompts, sha256 {sha}; tokens of {tok.name} (tokenizer.json sha256 {tok.sha256}): mean "
          f"{sum(n_tok) / len(n_tok):.1f}, max {max(n_tok)}, budget {snakemake.params.token_budget}")
