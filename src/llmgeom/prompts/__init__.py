"""Prompts stage (between models and extract): model-independent prompt sets and their files, built before any
model runs.

May import: numpy, the ``tokenizers`` library (the reference tokenizer of the token budgets, a base dependency)
and the standard library; llmgeom.core and llmgeom.measures (the exact posteriors
that SULA and wind-tunnel records carry in their meta). Never torch or transformers, never
llmgeom.models, extract, weights, interventions, wind_tunnel, analyses, plots or workflow. SULA's label
choice needs a tokenizer, but only as an object passed in (:func:`llmgeom.prompts.sula.choose_label_pairs`);
loading it from a prepared model is :func:`llmgeom.models.loading.load_tokenizer`, so no model import is
needed here.

Modules (one job each):

* :mod:`~llmgeom.prompts.sources` - text sources: Wikipedia Vital Articles summaries (located with
  ``importlib.util.find_spec``, never imported), stdlib source files, WikiText-style local files.
* :mod:`~llmgeom.prompts.cleaning` - invisible format characters, emptied formula slots, clause cutting.
* :mod:`~llmgeom.prompts.code` - stdlib source cut into chunks of whole statements.
* :mod:`~llmgeom.prompts.tokens` - the reference tokenizer (``prompts.tokenizer``) that counts every set's token
  budget, and the search for the longest piece within it.
* :mod:`~llmgeom.prompts.builders` - one builder per prompt set kind (mixed, domain, code, corpus),
  registered in ``BUILDERS``; :func:`~llmgeom.prompts.builders.build_prompt_set` checks and dispatches.
* :mod:`~llmgeom.prompts.io` - JSON Lines read/write (atomic, byte-deterministic, refuses Cf characters).
* :mod:`~llmgeom.prompts.sula` - SULA prompt sets (Paper III sec. 4.3 / 5.2) for one tokenizer's labels.
* :mod:`~llmgeom.prompts.wind_tunnel` - wind-tunnel tasks (Paper I): spec checks, seeded sequences, token
  layout and prompt records with the exact posteriors of :mod:`llmgeom.measures.bayes`.

This package imports nothing at import time.
"""
