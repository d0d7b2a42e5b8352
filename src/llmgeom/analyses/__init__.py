"""Stage 3, analyses: HDF5 activation files and tables -> tidy tables, one module per table family, named
like the tables they write (value_manifold, domain_restriction, attention_focusing, intrinsic_dimension,
curvature, margins, fisher, sula, interventions, wind_tunnel, bayes_tables, checkpoint_trajectory, drift).

May import: numpy, scipy, pandas, h5py, llmgeom.measures, llmgeom.core, and torch-free constants of
llmgeom.prompts. Never torch, never a model.
"""
