"""Stage 2, extract: the one capture API with named hook points (capture), the forward pass -> HDF5 (forward), prompt sets from Wikipedia, code and
corpora (prompts), SULA prompts (sula_prompts).

May import: torch, transformers, tokenizers, llmgeom.models, llmgeom.measures, llmgeom.core.
Never analyses, weights, interventions, plots or workflow.
"""
