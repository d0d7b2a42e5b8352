"""The workflow's side of the activation store: where the rules put activation and prompt files, and what a
workflow user runs when an activation file cannot be trusted.

``core.store`` knows no workflow; :func:`install` gives it this module's
:data:`CONTEXT` (``store.use_context``). :class:`llmgeom.pipeline.jobs.run_logged` installs it in every
workflow job (the scripts and the model server run through it), so an analysis run by the workflow checks its
activation file against the current prompt file and its errors name the rule and the ``snakemake --forcerun``
command; a notebook call without the workflow gets ``store.PLAIN``'s hint (the extraction function).

Layout (the ``output:`` of rules ``extract`` / ``extract_sula`` and the prompt rules):
``<root>/results/<model>/activations/<set>.h5`` from ``<root>/resources/prompts/<set>.jsonl``, and
``<root>/results/<model>/activations/sula_<cond>.h5`` from ``<root>/resources/prompts/sula/<model>/<cond>.jsonl``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from llmgeom.core import store


def rerun_hint(path) -> str:
    """The workflow's rerun hint for the activation file ``path``: the rule and the command."""
    return (f"rerun rule extract (extract_sula for SULA sets) for it: snakemake --forcerun {path} "
            "(reruns it and every analysis that reads it)")


def prompt_file(h5_path, prompt_set) -> Path | None:
    """The prompt file a workflow activation file was extracted from, when it exists; else None (a file outside
    the layout above, or whose name is not its ``prompt_set``)."""
    p = Path(h5_path)
    if not prompt_set or p.parent.name != "activations" or len(p.parents) < 4 or p.parents[2].name != "results":
        return None
    prompts = p.parents[3] / "resources" / "prompts"
    if p.stem == prompt_set:
        cand = prompts / f"{prompt_set}.jsonl"
    elif p.stem == f"sula_{prompt_set}":
        cand = prompts / "sula" / p.parents[1].name / f"{prompt_set}.jsonl"
    else:
        return None
    return cand if cand.is_file() else None


#: The store context of a workflow job.
CONTEXT = store.StoreContext(rerun_hint=rerun_hint, prompt_file=prompt_file)


def install() -> store.StoreContext:
    """Make :data:`CONTEXT` the store's context in this process; returns the previous one."""
    return store.use_context(CONTEXT)


@contextlib.contextmanager
def installed():
    """:data:`CONTEXT` installed for the ``with`` block, the previous context restored after it (tests)."""
    prev = install()
    try:
        yield CONTEXT
    finally:
        store.use_context(prev)
