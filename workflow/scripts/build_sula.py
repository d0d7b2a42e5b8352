from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    from llmgeom.prompts.io import write_prompt_set
    from llmgeom.models.loading import load_tokenizer
    from llmgeom.prompts.sula import build_sula_sets
    from llmgeom.pipeline.schema import call_with_config

    p = snakemake.params
    tok = load_tokenizer(snakemake.input.model)
    sets, pairs = call_with_config(build_sula_sets, p.cfg, tok, conditions=p.conditions)
    print(f"{snakemake.wildcards.model}: label pairs used (label: token id): "
          + "; ".join(", ".join(f"{w!r}: {i}" for w, i in zip(q["labels"], q["token_ids"])) for q in pairs))
    for cond, path in zip(p.conditions, snakemake.output):
        sha = write_prompt_set(sets[cond], path)
        print(f"{cond}: {len(sets[cond])} prompts, sha256 {sha}")
