"""Stage 5, the pipeline: what the Snakemake workflow (``Snakefile``, ``workflow/rules``, ``workflow/scripts``)
needs of the package and nothing else does. Named ``pipeline`` (not ``workflow``) so that it is
not mistaken for the top-level ``workflow/`` folder of rules and scripts. The config schema, its defaults and the
schema-as-signature calls (schema), the config checks before any job (checks), the values the rules derive
(derived), config/README.md (config_reference), cluster resources
and the one declaration of the GPU rules (cluster), the package's import graph and the code a rule runs
(code_tracking), provenance, checkpoint sweeps (sweeps), job logging (jobs), the activation store's workflow context (layout: the
rules' output layout and rerun hints, installed by jobs.run_logged), the per-model server that loads a model's
weights once for its GPU jobs (model_server). Imported by the Snakefile, the rules and
workflow/scripts only; nothing in the package imports it except ``llmgeom.defaults`` (the schema's defaults for a
notebook, imported on call).

May import: anything of llmgeom, lazily where the DAG build must stay fast (no torch at DAG time).
"""
