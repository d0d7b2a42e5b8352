"""Provenance of a run: package versions, model revisions, config and prompt-set hashes.

``results/provenance.json`` (and a Markdown rendering for the report) answer "what exactly produced
these tables?": the config (after schema defaults) and its sha256, the versions of the packages that
determine stored values (now, and as recorded in every HDF5 file at extraction), each prepared
model's source, requested and resolved revision and source sha256, each prompt set's sha256 (and
whether every HDF5 file was extracted from that version).

Source: DESIGN.md section 1 (stage 6, report; reproducibility).
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from llmgeom.core.io import sha256_file
from llmgeom.core.versions import package_versions


def config_sha256(config: dict) -> str:
    """sha256 of the config as canonical JSON (sorted keys, no whitespace): equal configs, equal hash."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def resolved_revision(weights_path: str | None) -> str | None:
    """Commit hash of a Hugging Face cache snapshot (``.../snapshots/<commit>``), else None."""
    if not weights_path:
        return None
    p = Path(weights_path)
    return p.name if p.parent.name == "snapshots" else None


def git_state(path: str | Path) -> dict | None:
    """``{"commit", "dirty"}`` of the git checkout holding ``path`` (the workflow), None if not a checkout."""
    try:
        commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=20)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=20)
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


def collect(config: dict, *, models: list[str], prompt_sets: list[str], root: str | Path = ".",
            workflow_dir: str | Path | None = None) -> dict:
    """Gather the provenance record of a run rooted at ``root`` (the Snakemake working directory).

    Reads ``resources/models/<model>/manifest.json``, ``resources/prompts/<set>.jsonl`` and the root
    attributes of every ``results/<model>/activations/<set>.h5`` that exists (no datasets are read).

    Returns:
        dict with ``created`` (UTC), ``config_sha256``, ``config``, ``packages``, ``platform``,
        ``workflow_git``, ``models`` (per model: source, repo_id, package, gguf_file, parts (split_gguf), source_version,
        revision, resolved_revision, source_sha256, model_type, dtype requested, and per extracted set
        the dtype/device used and the package versions at extraction), ``prompt_sets`` (per set:
        sha256, n_records) and ``mismatches`` (HDF5 files extracted from another prompt-set version).
    """
    import h5py

    from llmgeom.core.store import (
        attrs_dict,  # sets HDF5_USE_FILE_LOCKING before h5py is imported
    )

    root = Path(root)
    rec = {
        "created": datetime.now(timezone.utc).isoformat(),
        "config_sha256": config_sha256(config),
        "packages": package_versions(),
        "platform": {"python": sys.version.split()[0], "system": platform.system(), "machine": platform.machine()},
        "workflow_git": git_state(workflow_dir) if workflow_dir else None,
        "models": {},
        "prompt_sets": {},
        "mismatches": [],
        "config": config,
    }
    files = [(s, root / "resources" / "prompts" / f"{s}.jsonl") for s in prompt_sets]
    # per-model SULA prompt sets (resources/prompts/sula/<model>/<condition>.jsonl)
    files += [(f"sula/{m}/{p.stem}", p) for m in models
              for p in sorted((root / "resources" / "prompts" / "sula" / m).glob("*.jsonl"))]
    for s, p in files:
        if p.is_file():
            n = sum(1 for line in p.read_text(encoding="utf-8").splitlines() if line.strip())
            rec["prompt_sets"][s] = {"sha256": sha256_file(p), "n_records": n, "path": str(p)}
    for m in models:
        man_path = root / "resources" / "models" / m / "manifest.json"
        man = json.loads(man_path.read_text()) if man_path.is_file() else {}
        entry = {k: man.get(k) for k in ("source", "repo_id", "package", "gguf_file", "gguf_architecture",
                                         "source_version", "revision", "source_sha256")}
        entry["parts"] = man.get("parts")  # split_gguf: every part package, its version, file and size
        entry["resolved_revision"] = resolved_revision(man.get("weights_path"))
        entry["weights_path"] = man.get("weights_path") if man.get("source") not in ("package_gguf", "split_gguf") else None
        entry["model_type"] = (man.get("architecture") or {}).get("model_type")
        entry["dtype_requested"] = (config.get("models", {}).get(m) or {}).get("dtype")
        entry["extractions"] = {}
        for h5 in sorted((root / "results" / m / "activations").glob("*.h5")):
            s = h5.stem
            with h5py.File(h5, "r") as f:
                a = attrs_dict(f)
            entry["extractions"][s] = {k: a.get(k) for k in ("torch_dtype", "device", "attn_implementation",
                                                              "prompt_set_sha256", "contract_version", "versions")}
            key = f"sula/{m}/{s[len('sula_'):]}" if s.startswith("sula_") and s not in prompt_sets else s
            want = rec["prompt_sets"].get(key, {}).get("sha256")
            if want and a.get("prompt_set_sha256") != want:
                rec["mismatches"].append(f"{h5}: extracted from prompt set sha256 {a.get('prompt_set_sha256')}, "
                                         f"current {s}.jsonl is {want}")
        rec["models"][m] = entry
    return rec


def to_markdown(rec: dict) -> str:
    """Human-readable summary of :func:`collect`'s record (for the Snakemake report)."""
    lines = ["# Provenance", "", f"- created: {rec['created']}", f"- config sha256: `{rec['config_sha256']}`"]
    g = rec.get("workflow_git")
    if g:
        lines.append(f"- workflow commit: `{g['commit']}`{' (uncommitted changes)' if g['dirty'] else ''}")
    lines += ["", "## Models", "", "| model | source | revision | resolved revision | source sha256 | dtype |",
              "|---|---|---|---|---|---|"]
    for m, e in rec["models"].items():
        pkg = (f"{e['parts'][0]['package']} .. {e['parts'][-1]['package']} ({len(e['parts'])} parts)"
               if e.get("parts") else e.get("package"))
        src = e.get("repo_id") or (f"{pkg}=={e.get('source_version')} / {e.get('gguf_file')}"
                                   if pkg else e.get("weights_path"))
        dtypes = sorted({str(x.get("torch_dtype")) for x in e["extractions"].values()}) or [str(e["dtype_requested"])]
        lines.append(f"| {m} | {e.get('source')}: {src} | {e.get('revision') or ''} | {e.get('resolved_revision') or ''} "
                     f"| `{(e.get('source_sha256') or '')[:16]}` | {', '.join(dtypes)} |")
    lines += ["", "## Prompt sets", "", "| prompt set | records | sha256 |", "|---|---|---|"]
    for s, e in rec["prompt_sets"].items():
        lines.append(f"| {s} | {e['n_records']} | `{e['sha256']}` |")
    lines += ["", "## Packages", "", "| package | version |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rec["packages"].items()]
    if rec["mismatches"]:
        lines += ["", "## Mismatches (rerun rule extract for these)", ""] + [f"- {x}" for x in rec["mismatches"]]
    lines += ["", "The full config (after schema defaults) is in `results/provenance.json`.", ""]
    return "\n".join(lines)


def write(rec: dict, json_path, md_path) -> None:
    """Write the record as JSON and Markdown, each to a temporary name renamed when complete."""
    from llmgeom.core.io import write_text

    for path, text in ((Path(json_path), json.dumps(rec, indent=2, sort_keys=True, default=str) + "\n"),
                       (Path(md_path), to_markdown(rec))):
        write_text(text, path)
