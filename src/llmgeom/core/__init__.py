"""Stage 0, core: the HDF5 store and its contract (store), atomic writes (io), statistics (stats: one
Pearson, one Spearman, bootstrap intervals and bias-corrected estimates, derived seeds), layer specifications
(layers), units, versions, progress bars for job logs (progress), published values (published: the package
data file data/published.yaml).

May import: the standard library, numpy, scipy, pandas, h5py, yaml, tqdm. Nothing else of llmgeom.
"""
