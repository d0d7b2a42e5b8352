"""The package layout shows the pipeline (issue 10): stages import only those below them, the
analyses / measures / core / plots never load torch, no module imports another's private names, and no
function is defined twice. DESIGN.md section 1."""

from __future__ import annotations

import ast
import hashlib
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from llmgeom.pipeline import code_tracking

PKG = code_tracking.PACKAGE_DIR

# A subpackage may import itself and the subpackages of a lower rank, never one of its own rank or above.
# prompts (model-independent) sit between models and extract: extraction, interventions, the wind tunnel and the
# workflow read prompt sets; prompts themselves import only core and measures (DESIGN.md sec. 1).
RANK = {"core": 0, "measures": 1, "models": 1, "prompts": 2, "extract": 3, "weights": 3, "interventions": 4,
        "wind_tunnel": 4, "analyses": 4, "plots": 5, "pipeline": 6}
ALLOWED_EXTRA = {("measures", "models"): False}  # measures import nothing of the package but core
TORCH_FREE = ("core", "measures", "prompts", "analyses", "plots")


def _graph() -> dict[str, set[str]]:
    return code_tracking.import_graph()


def test_every_subpackage_is_ranked_and_documented():
    subs = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").is_file())
    assert set(subs) <= set(RANK), f"new subpackage without a rank in this test: {set(subs) - set(RANK)}"
    for s in subs:
        doc = ast.get_docstring(ast.parse((PKG / s / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"llmgeom.{s}/__init__.py must say what it may import"
    assert not [p.name for p in PKG.glob("*.py") if p.name != "__init__.py"], "modules belong in a stage subpackage"


def test_imports_go_down_the_stages_only():
    bad = []
    for m, deps in _graph().items():
        top = m.split(".")[0]
        for d in deps:
            dt = d.split(".")[0]
            if dt == top:
                continue
            if top == "measures" and dt != "core":
                bad.append(f"{m} -> {d} (measures import only core)")
            elif top == "prompts" and dt not in ("core", "measures"):
                bad.append(f"{m} -> {d} (prompts import only core and measures: a tokenizer is passed in)")
            elif RANK[dt] >= RANK[top]:
                bad.append(f"{m} -> {d} (rank {RANK[top]} imports rank {RANK[dt]})")
    assert not bad, "\n".join(bad)


def test_import_graph_has_no_cycle():
    g = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for d in g.get(m, ()):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d):] + [d]))
            if d in g and state.get(d) is None:
                visit(d)
        path.pop()
        state[m] = 2

    for m in g:
        if m not in state:
            visit(m)


@pytest.mark.parametrize("stage", TORCH_FREE)
def test_torch_free_stages_never_import_torch(stage):
    mods = [m for m in code_tracking.all_modules() if m.split(".")[0] == stage]
    assert mods
    code = "import sys\n" + "".join(f"import llmgeom.{m}\n" for m in mods) + \
        "print(sorted(x for x in ('torch', 'transformers') if x in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", f"llmgeom.{stage} imported {r.stdout.strip()}"


def test_no_private_names_imported_across_modules():
    bad = []
    for p in sorted(PKG.rglob("*.py")) + sorted((PKG.parents[1] / "workflow" / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llmgeom"):
                bad += [f"{p.name}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
    assert not bad, "\n".join(bad)


def _module_aliases(tree) -> dict[str, str]:
    """Local name -> llmgeom module path for the package modules a file imports (``from llmgeom.a import b as c``,
    ``import llmgeom.a.b as c``)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llmgeom"):
            base = PKG.joinpath(*node.module.split(".")[1:])
            for a in node.names:
                if (base / f"{a.name}.py").is_file() or (base / a.name / "__init__.py").is_file():
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("llmgeom.") and a.asname:
                    out[a.asname] = a.name
    return out


def test_no_private_names_used_across_modules():
    """``module._private`` of another package module is not read either (a private name stays in its module)."""
    bad = []
    for p in sorted(PKG.rglob("*.py")) + sorted((PKG.parents[1] / "workflow" / "scripts").glob("*.py")):
        tree = ast.parse(p.read_text())
        aliases = _module_aliases(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{p.name}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    assert not bad, "\n".join(bad)


#: The one module that registers torch hooks and patches transformers' attention interface (DESIGN.md sec. 1).
HOOK_MODULE = "extract/hooks.py"


def test_torch_hooks_and_attention_patching_live_in_one_module():
    """Every ``register_*hook`` call and every use of transformers' attention-function registry
    (``ALL_ATTENTION_FUNCTIONS``, ``AttentionInterface``) is in :data:`HOOK_MODULE`, and that module has them."""
    import re

    found = defaultdict(list)
    for p in sorted(PKG.rglob("*.py")) + sorted((PKG.parents[1] / "workflow" / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            name = (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name)
                    else node.name if isinstance(node, ast.alias) else None)
            if name and (re.fullmatch(r"register_\w*hook", name) or name in (
                    "ALL_ATTENTION_FUNCTIONS", "AttentionInterface", "_local_mapping")):
                found[str(p.relative_to(PKG)) if PKG in p.parents else p.name].append(f"{name}:{node.lineno}")
    assert set(found) == {HOOK_MODULE}, {k: v for k, v in found.items() if k != HOOK_MODULE}


def _body_key(fn: ast.FunctionDef) -> str:
    body = fn.body[1:] if ast.get_docstring(fn) else fn.body
    return hashlib.sha256(ast.dump(ast.Module(body=body, type_ignores=[])).encode()).hexdigest()


def test_no_function_defined_twice():
    seen = defaultdict(list)
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.FunctionDef) and len(node.body) > 2:
                seen[_body_key(node)].append(f"{p.relative_to(PKG)}:{node.name}")
    dups = [v for v in seen.values() if len(v) > 1]
    assert not dups, f"same function body defined more than once: {dups}"
    names = defaultdict(list)
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name in {"pearson", "spearman", "_pearson", "_spearman",
                                                                     "atomic_path", "select_layers", "_layers"}:
                names[node.name].append(str(p.relative_to(PKG)))
    assert names == {"pearson": ["core/stats.py"], "spearman": ["core/stats.py"],
                     "atomic_path": ["core/io.py"], "select_layers": ["core/layers.py"]}, dict(names)


def test_public_functions_are_documented():
    import importlib
    import inspect

    bad = []
    for m in code_tracking.all_modules():
        mod = importlib.import_module(f"llmgeom.{m}")
        if not (mod.__doc__ and len(mod.__doc__.strip()) > 20):
            bad.append(f"module llmgeom.{m}")
        for n, o in vars(mod).items():
            if n.startswith("_") or not callable(o) or getattr(o, "__module__", None) != mod.__name__:
                continue
            if not (inspect.getdoc(o) and len(inspect.getdoc(o)) > 20):
                bad.append(f"llmgeom.{m}.{n}")
    assert not bad, bad


# --------------------------------------------------------------------------- environments (issue 10 item 4)

REPO = PKG.parents[1]


def _pins(env_file: Path) -> dict[str, str]:
    """``name==version`` lines of a conda env file's pip section -> {normalized name: version}."""
    import re

    import yaml

    env = yaml.safe_load(env_file.read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    pins = {}
    for req in pip:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;]+)", req.strip())
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


@pytest.mark.parametrize("env", ["analysis.yaml", "torch.yaml"])
def test_env_files_pin_the_installed_versions(env):
    """Every dependency in envs/<env> is pinned, and a pinned package that is installed here has exactly
    that version (the local build label, e.g. torch's ``+cpu``, is ignored); one not installed is skipped."""
    from importlib.metadata import PackageNotFoundError, version

    import yaml

    pip = next(d["pip"] for d in yaml.safe_load((REPO / "envs" / env).read_text())["dependencies"]
               if isinstance(d, dict) and "pip" in d)
    unpinned = [r for r in pip if not r.startswith("-e ") and "==" not in r]
    assert not unpinned, f"envs/{env}: pin these to the tested versions: {unpinned}"
    pins = _pins(REPO / "envs" / env)
    assert pins
    wrong = {}
    for name, pinned in pins.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue
        if installed.split("+")[0] != pinned:
            wrong[name] = (pinned, installed)
    assert not wrong, f"envs/{env} pins differ from the installed versions (pinned, installed): {wrong}"


def test_analysis_env_is_the_base_dependencies_and_torch_is_an_extra():
    """pyproject: base dependencies = the analysis stack of envs/analysis.yaml (no torch); torch,
    transformers, accelerate, gguf come with the ``[models]`` extra, which envs/torch.yaml installs."""
    import re
    import tomllib

    proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", r).group(0)).lower() for r in reqs}

    base, models = names(proj["dependencies"]), names(proj["optional-dependencies"]["models"])
    assert models == {"torch", "transformers", "accelerate", "gguf"} and not base & models
    assert base == set(_pins(REPO / "envs" / "analysis.yaml"))
    assert models == set(_pins(REPO / "envs" / "torch.yaml"))
    assert "-e ../[models]" in (REPO / "envs" / "torch.yaml").read_text()
    assert '".[models,test,workflow]"' in (REPO / "install.sh").read_text()


#: a ticket reference: "issue 28", "issues 19, 28", "Issue #7", "issue-13", also broken over a line end
TICKET = re.compile(r"\b[Ii]ssues?\s*#?[0-9]+|\bissue-[0-9]+")


def _code_and_rule_files() -> list[Path]:
    files = [REPO / "Snakefile"]
    for top in ("src", "workflow"):
        files += sorted(p for p in (REPO / top).rglob("*")
                        if p.suffix in (".py", ".smk", ".rst", ".yaml", ".yml", ".md") and "__pycache__" not in p.parts)
    return files


def test_ticket_numbers_only_in_git_history():
    """No "issue N" in code, rules, report captions or package data: a comment says why, git log keeps the history."""
    files = _code_and_rule_files()
    assert REPO / "src/llmgeom/pipeline/cluster.py" in files and REPO / "workflow/rules/common.smk" in files
    found = []
    for p in files:
        rel = p.relative_to(REPO).as_posix()
        text = p.read_text(encoding="utf-8")
        found += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in TICKET.finditer(text)]
    assert not found, "ticket numbers in code (say why instead; git log keeps the history):\n" + "\n".join(found)


def test_ticket_pattern_finds_the_reference_styles():
    hits = ["(issue 28)", "; issue 13 item 3", "Issue 19: a table", "(issues 19, 28)", "issue #7", "issue-13",
            "issue\n            28)"]
    misses = ["tissue 3", "an issue with your definition", "issues a warning"]
    assert [bool(TICKET.search(s)) for s in hits + misses] == [True] * len(hits) + [False] * len(misses)


def test_tests_are_laid_out_by_stage():
    """tests/unit/<stage>/ (a stage subpackage of llmgeom), tests/workflow/ (the .test study), tests/cluster/ (SLURM),
    tests/support/ (helpers, no tests); no test file at the top; the longest-first order comes from each file's
    ``minutes`` marker, not from a list of file names in conftest.py."""
    tests = REPO / "tests"
    stages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    assert sorted(p.name for p in tests.glob("*.py")) == ["conftest.py"]
    assert {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "unit", "workflow", "cluster", "support"}
    unit = {p.name for p in (tests / "unit").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert unit <= stages, f"tests/unit/ folders that are no stage of llmgeom: {sorted(unit - stages)}"
    assert not list((tests / "support").glob("test_*.py")), "support code holds no tests"
    for d in ("unit", "workflow", "cluster"):
        for p in (tests / d).rglob("*.py"):
            assert p.name.startswith("test_"), f"{p.relative_to(REPO)}: a helper module belongs in tests/support/"
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), "test file names must be unique (pytest's prepend import mode)"
    conftest = (tests / "conftest.py").read_text()
    assert not re.search(r"[\"']test_\w+\.py[\"']", conftest), "conftest.py names no test files (use the marker)"
