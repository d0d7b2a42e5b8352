"""The package's import graph, and the code a rule runs: a rule reruns when that code changes.

* ``module_imports(path)``: the ``llmgeom`` modules a source file imports (found with ``ast``; imports inside
  functions count); ``import_graph()``: that for every module of the package (tests/unit/pipeline/test_layout.py checks the
  layer rules of DESIGN.md on it).
* ``package_files(*modules)`` lists the source files of ``llmgeom`` modules and of every ``llmgeom``
  module they import, transitively. A rule lists them as a named input, ``code=code("value_manifold")`` (the
  modules its script imports), so that editing that code reruns the rule (Snakemake compares input mtimes and,
  for files under 1 MB, checksums: touching a file without changing it reruns nothing). ``llmgeom.pipeline``
  (config checks, logging, cluster) and ``models.tiny`` are not tracked.

Standard library only (imported while Snakemake builds the DAG). Source: DESIGN.md section 1.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

from llmgeom.core.versions import PACKAGE_DIR  # src/llmgeom (standard library only, as this module)
UNTRACKED_PACKAGES = frozenset({"pipeline"})  # config checks, logging, cluster: never change a stored value
UNTRACKED_MODULES = frozenset({"models.tiny"})


def module_file(name: str) -> Path | None:
    """Source file of the dotted llmgeom module ``name`` ("analyses.value_manifold"; "models" is the
    subpackage's ``__init__.py``), or None."""
    base = PACKAGE_DIR / Path(*name.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _resolve(pkg_parts: list[str], names: list[str]) -> set[str]:
    """``from llmgeom.<pkg_parts> import names``: each name that is a submodule, else the module itself."""
    mod = ".".join(pkg_parts)
    out = set()
    for n in names:
        sub = f"{mod}.{n}" if mod else n
        if module_file(sub) is not None and not (mod and module_file(mod) and module_file(mod).name != "__init__.py"):
            out.add(sub)
        elif mod:
            out.add(mod)
    return out


@functools.lru_cache(maxsize=None)
def module_imports(path: str) -> tuple[str, ...]:
    """Dotted names (relative to ``llmgeom``) of the package modules that the source file ``path``
    imports, at any nesting level (imports inside functions count)."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                raise ValueError(f"{path}: relative import 'from {'.' * node.level}{mod} import ...'; the package "
                                 "uses absolute imports (from llmgeom.<stage>.<module> import ...)")
            if mod == "llmgeom" or mod.startswith("llmgeom."):
                found |= _resolve(mod.split(".")[1:], [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "llmgeom" and len(parts) > 1:
                    found.add(".".join(parts[1:]))
    return tuple(sorted(found))


def _untracked(name: str) -> bool:
    return name.split(".")[0] in UNTRACKED_PACKAGES or name in UNTRACKED_MODULES or name.endswith("__init__")


def all_modules() -> list[str]:
    """Every module of the package, dotted ("core.store", ...), subpackage ``__init__`` files left out."""
    return sorted(".".join(p.relative_to(PACKAGE_DIR).with_suffix("").parts) for p in PACKAGE_DIR.rglob("*.py")
                  if p.name != "__init__.py")


def package_modules(*modules: str) -> list[str]:
    """``modules`` (dotted, e.g. "analyses.value_manifold") and every ``llmgeom`` module they import,
    transitively; workflow support, tiny test models and package ``__init__`` files are left out.

    Raises:
        ValueError: a named module that is not a file of the package.
    """
    for m in modules:
        if module_file(m) is None:
            raise ValueError(f"pkg({m!r}): there is no module llmgeom.{m}; valid: {', '.join(all_modules())}")
    seen: set[str] = set()
    stack = list(modules)
    while stack:
        m = stack.pop()
        p = module_file(m)
        if m in seen or p is None:
            continue
        seen.add(m)
        stack.extend(module_imports(str(p)))
    return sorted(m for m in seen if not _untracked(m))


def script_modules(script: str | os.PathLike) -> list[str]:
    """The package modules a workflow script runs: what it imports, transitively (see package_modules)."""
    return package_modules(*[m for m in module_imports(str(script)) if module_file(m) is not None])


def package_files(*modules: str, cwd: str | os.PathLike | None = None, script: str | os.PathLike | None = None) -> list[str]:
    """Source files of ``package_modules(*modules)`` (plus, with ``script``, of what that script imports) and
    the package data files they read (``MODULE_DATA``): relative to ``cwd`` (the Snakemake working directory) when the package lies below it, absolute otherwise."""
    base = Path(cwd or os.getcwd()).resolve()
    mods = set(package_modules(*modules)) | (set(script_modules(script)) if script else set())
    out = []
    for m in sorted(mods):
        for p in [module_file(m)] + [PACKAGE_DIR / d for d in MODULE_DATA.get(m, ())]:
            try:
                out.append(str(p.relative_to(base)))
            except ValueError:
                out.append(str(p))
    return out


#: package data read by a module: a rule whose code imports the module also reruns when the data change
#: (e.g. a published value added to data/published.yaml reruns the tables that show it).
MODULE_DATA = {"core.published": ("data/published.yaml",)}


def import_graph() -> dict[str, set[str]]:
    """Every module of the package (dotted, ``all_modules``) -> the package modules it imports (itself left out)."""
    return {m: {d for d in module_imports(str(module_file(m))) if d != m} for m in all_modules()}
