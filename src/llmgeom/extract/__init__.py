"""Stage 2, extract: the forward pass with hooks -> HDF5 (forward), on prompt sets built by llmgeom.prompts.

May import: torch, transformers, tokenizers, llmgeom.prompts, llmgeom.models, llmgeom.measures, llmgeom.core.
Never analyses, weights, interventions, plots or workflow.
"""
