"""llmgeom: measure the geometry of LLM internal representations.

Reproduces "Geometric Scaling of Bayesian Inference in LLMs" (Paper III) and
"Latent Semantic Manifolds in Large Language Models" (LSM). See DESIGN.md.
"""

__version__ = "0.1.0"
