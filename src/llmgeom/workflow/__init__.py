"""Stage 5, workflow support: config checks (config), cluster resources and code tracking (cluster),
provenance, checkpoint sweeps (sweeps), job logging (jobs), the activation store's workflow context (layout: the
rules' output layout and rerun hints, installed by jobs.run_logged), the per-model server that loads a model's
weights once for its GPU jobs (model_server). Imported by the Snakefile, the rules and
workflow/scripts only; nothing in the package imports it.

May import: anything of llmgeom, lazily where the DAG build must stay fast (no torch at DAG time).
"""
