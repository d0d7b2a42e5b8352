"""Stage 3, interventions: value edits on the entropy axis (edits), the axes (axes, numpy only) and the
runner that puts SULA prompts through an edited model (runner). Paper III sec. 4.5-4.6.

May import: torch, llmgeom.models, llmgeom.extract, llmgeom.measures, llmgeom.core.
"""
