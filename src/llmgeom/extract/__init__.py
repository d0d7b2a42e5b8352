"""Stage 2, extract: the forward pass with hooks -> HDF5 (forward), prompt sets from Wikipedia, code and
corpora (prompts), SULA prompts (sula_prompts).

May import: torch, transformers, tokenizers, llmgeom.models, llmgeom.measures, llmgeom.core.
Never analyses, weights, interventions, plots or workflow.
"""
