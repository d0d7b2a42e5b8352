"""Stage 4, plots: figures from tidy tables only. base (style, save_figure) and one module per family.

May import: matplotlib, numpy, pandas, llmgeom.core. Never torch, never an activation file.
"""
