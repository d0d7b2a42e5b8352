"""Wind tunnel: small transformers trained where the Bayesian posterior is exact.

Stage 3, GPU-side work that trains models. May import: numpy, torch, transformers, tokenizers,
llmgeom.core and llmgeom.models (``models.architectures`` for the manifest's architecture summary);
llmgeom.prompts (the tasks: :mod:`llmgeom.prompts.wind_tunnel`) and llmgeom.measures (exact posteriors).

Sources: Paper I ("The Bayesian Geometry of Transformer Attention": bijection elimination and HMM
filtering tasks, entropy calibration), Paper II ("Gradient Dynamics of Attention": geometry over
training checkpoints), Paper III ("Geometric Scaling of Bayesian Inference in LLMs": the wind-tunnel
geometry as the reference for LLMs). DESIGN.md section 3, "Wind tunnel".

Modules:

* :mod:`llmgeom.wind_tunnel.train` - torch + transformers: trains one model and saves it as a plain
  Hugging Face directory with ``manifest.json`` and ``training_log.csv``.

The tasks live below this stage, torch-free: parameter checks, samplers, vocabulary / text layout and
prompt-set records in :mod:`llmgeom.prompts.wind_tunnel` (the workflow's config checks read it), the exact
posteriors and their brute-force references in :mod:`llmgeom.measures.bayes`.

This package imports nothing at import time.
"""
