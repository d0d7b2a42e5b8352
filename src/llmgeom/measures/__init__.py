"""Stage 1, measures: pure array functions of the science (PCA shares and participation ratio, TwoNN /
MLE, local PCA curvature, margins and eta(eps), the Fisher metric, key orthogonality, the exact SULA
posterior).

May import: numpy, scipy, scikit-learn, scikit-dimension, and llmgeom.core. Never torch, never a file.
"""
