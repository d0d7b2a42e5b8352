"""Wind tunnel: small transformers trained where the Bayesian posterior is exact.

GPU-side work that trains models: may import numpy, torch, transformers, tokenizers; nothing of
llmgeom but llmgeom.core.

Sources: Paper I ("The Bayesian Geometry of Transformer Attention": bijection elimination and HMM
filtering tasks, entropy calibration), Paper II ("Gradient Dynamics of Attention": geometry over
training checkpoints), Paper III ("Geometric Scaling of Bayesian Inference in LLMs": the wind-tunnel
geometry as the reference for LLMs). DESIGN.md section 3, "Wind tunnel".

Modules:

* :mod:`llmgeom.wind_tunnel.tasks` - numpy only: task samplers, exact posteriors, brute-force
  references, parameter checks, vocabulary / text layout, prompt-set records.
* :mod:`llmgeom.wind_tunnel.train` - torch + transformers: trains one model and saves it as a plain
  Hugging Face directory with ``manifest.json`` and ``training_log.csv``.

This package imports nothing at import time (the workflow may read ``tasks`` without torch).
"""
