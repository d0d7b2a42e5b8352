"""Cluster-scale helpers for the Snakemake rules: GPU-rule resources per model, memory that grows
with the retry attempt, and tracking of the package code a rule runs (issue 7).

* ``GPU_RULES`` is the one list of rules that need a GPU; the SLURM profile, the README and
  ``tests/test_cluster.py`` refer to it. Every other rule is CPU-only.
* ``gpu_job_resources(models)`` returns the ``resources:`` of a GPU rule, per model entry:
  ``gpu`` (``gpus``), ``gpu_model`` (omitted when null), ``mem_mb`` (x1.5 per retry) and ``runtime``.
  A rule writes ``resources: **GPU_RESOURCES`` (defined in ``workflow/rules/common.smk``).
* ``apply_size_defaults(config)``: a model entry that gives ``params_b`` (parameters, billions) but not
  ``mem_mb`` / ``runtime`` gets them derived from its size and dtype (see ``size_resources``).
* ``package_files(*modules)`` lists the source files of ``llmgeom`` modules and of every ``llmgeom``
  module they import (transitively, found with ``ast``; imports inside functions count). A rule lists
  them as a named input, ``code=pkg("tables")``, so that editing that code reruns the rule (Snakemake
  compares input mtimes and, for files under 1 MB, checksums: touching a file without changing it
  reruns nothing). ``workflow_support`` (logging, threads), ``testing`` and this module are not tracked.

Source: DESIGN.md section 1 (model sweeps; params as rule ``params:``); issue 7.
"""

from __future__ import annotations

import ast
import functools
import math
import os
from pathlib import Path

GPU_RULES = ("extract", "extract_sula", "intervene")

UNTRACKED_MODULES = frozenset({"__init__", "workflow_support", "testing", "cluster"})

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 4}  # auto: float32 on CPU (worst case)

PACKAGE_DIR = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- resources


def size_resources(params_b: float, dtype: str = "auto") -> dict:
    """Host memory (MB) and runtime (minutes) of one GPU-rule job for a model of ``params_b`` billion
    parameters: mem_mb = 4000 + 1.25 x weight bytes (weights pass through host memory while loading,
    plus tokenizer, prompts and HDF5 buffers); runtime = 20 + 30 min per billion parameters (one prompt
    set of a few hundred prompts; generous: a wall-clock limit, not an estimate)."""
    weight_mb = params_b * 1e9 * DTYPE_BYTES.get(dtype, 4) / 2**20
    return {"mem_mb": int(math.ceil((4000 + 1.25 * weight_mb) / 100.0) * 100),
            "runtime": int(math.ceil(20 + 30 * params_b))}


def apply_size_defaults(config: dict) -> dict:
    """For model entries with ``params_b`` and no explicit ``mem_mb`` / ``runtime``: derive them from
    the size (``size_resources``). Run before the schema defaults are filled in. Mutates ``config``."""
    for spec in config.get("models", {}).values():
        if spec.get("params_b"):
            for key, value in size_resources(float(spec["params_b"]), spec.get("dtype", "auto")).items():
                spec.setdefault(key, value)
    return config


def retry_mem_mb(mem_mb: int, attempt: int = 1, factor: float = 0.5) -> int:
    """Memory grown by ``factor`` x the base for every retry (attempt 1 = the base)."""
    return int(mem_mb * (1 + factor * (attempt - 1)))


def scaled_mem(mem_mb: int, factor: float = 0.5):
    """``resources: mem_mb=scaled_mem(4000)`` in a CPU rule: 4000, 6000, 8000 MB on attempts 1, 2, 3
    (``retries:`` in the SLURM profile), so a job killed for memory is resubmitted with more."""

    def fn(wildcards, attempt):
        return retry_mem_mb(mem_mb, attempt, factor)

    return fn


def gpu_job_resources(models: dict) -> dict:
    """``resources:`` of a GPU rule whose jobs have a ``{model}`` wildcard, read from the model entry:
    gpu = ``gpus`` (more than 1 only with ``device_map: auto``), gpu_model (omitted when null; the SLURM
    plugin turns it into ``--gpus=<model>:<n>``), mem_mb (host memory, x1.5 per retry) and runtime
    (minutes)."""
    return {
        "gpu": lambda w: int(models[w.model].get("gpus", 1)),
        "gpu_model": lambda w: models[w.model].get("gpu_model"),
        "mem_mb": lambda w, attempt: retry_mem_mb(models[w.model]["mem_mb"], attempt),
        "runtime": lambda w: int(models[w.model]["runtime"]),
    }


def check_gpu_config(config: dict) -> None:
    """Raises ``ConfigError`` for ``gpus`` > 1 without ``device_map: auto`` (the model would use one GPU
    and the others would sit idle in the allocation)."""
    from .workflow_support import ConfigError

    for name, spec in sorted(config.get("models", {}).items()):
        if int(spec.get("gpus") or 1) > 1 and spec.get("device_map") != "auto":
            raise ConfigError(f"models.{name}.gpus = {spec['gpus']} needs models.{name}.device_map = auto "
                              "(without it the model runs on one GPU); valid: gpus: 1, or add device_map: auto")


# --------------------------------------------------------------------------- code tracking


@functools.lru_cache(maxsize=None)
def module_imports(path: str) -> tuple[str, ...]:
    """Names of the ``llmgeom`` modules that the source file ``path`` imports (any nesting level)."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1 and not mod:  # from . import a, b
                found.update(a.name for a in node.names)
            elif node.level == 1:  # from .a import x
                found.add(mod.split(".")[0])
            elif node.level == 0 and mod == "llmgeom":  # from llmgeom import a
                found.update(a.name for a in node.names)
            elif node.level == 0 and mod.startswith("llmgeom."):  # from llmgeom.a import x
                found.add(mod.split(".")[1])
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "llmgeom" and len(parts) > 1:
                    found.add(parts[1])
    return tuple(sorted(found))


def package_modules(*modules: str) -> list[str]:
    """``modules`` and every ``llmgeom`` module they import, transitively (untracked ones left out).

    Raises:
        ValueError: a named module that is not a file of the package.
    """
    for m in modules:
        if not (PACKAGE_DIR / f"{m}.py").is_file():
            raise ValueError(f"pkg({m!r}): there is no module llmgeom.{m} ({PACKAGE_DIR / (m + '.py')} "
                             f"is missing); valid: {', '.join(sorted(p.stem for p in PACKAGE_DIR.glob('*.py')))}")
    seen: set[str] = set()
    stack = list(modules)
    while stack:
        m = stack.pop()
        p = PACKAGE_DIR / f"{m}.py"
        if m in seen or m in UNTRACKED_MODULES or not p.is_file():
            continue  # `from . import x` may name a function rather than a module
        seen.add(m)
        stack.extend(module_imports(str(p)))
    return sorted(seen)


def package_files(*modules: str, cwd: str | os.PathLike | None = None) -> list[str]:
    """Source files of ``package_modules(*modules)``: relative to ``cwd`` (the Snakemake working
    directory) when the package lies below it, absolute otherwise."""
    base = Path(cwd or os.getcwd()).resolve()
    out = []
    for m in package_modules(*modules):
        p = PACKAGE_DIR / f"{m}.py"
        try:
            out.append(str(p.relative_to(base)))
        except ValueError:
            out.append(str(p))
    return out
