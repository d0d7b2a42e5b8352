"""Stage 2, weights: analyses that read model weights without running prompts: key orthogonality of
W_K with its random-init baseline (key_orthogonality), the unembedding for the Fisher metric (unembedding).

May import: torch, transformers, llmgeom.models, llmgeom.measures, llmgeom.core.
"""
