"""Stage 0, core: the HDF5 store and its contract (store), atomic writes (io), statistics (stats: one
Pearson, one Spearman, bootstrap intervals, derived seeds), layer specifications (layers), units, versions.

May import: the standard library, numpy, scipy, pandas, h5py. Nothing else of llmgeom.
"""
