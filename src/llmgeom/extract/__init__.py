"""Stage 2, extract: the one capture API with named hook points (capture), the one module that registers torch
hooks and patches the attention interface (hooks), the attention maths on what it captures (attention) and the
forward pass -> HDF5 (forward), on prompt sets built by llmgeom.prompts.

May import: torch, transformers, tokenizers, llmgeom.prompts, llmgeom.models, llmgeom.measures, llmgeom.core.
Never analyses, weights, interventions, plots or workflow.
"""
