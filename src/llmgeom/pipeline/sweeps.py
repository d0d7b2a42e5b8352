"""Training-checkpoint sweeps: the same model at several training steps, each a separate model entry
(``revision: step1000`` ...), joined by step to trace geometry over training
(``config/pythia_checkpoints.yaml``).

The trajectory reads only the cross-model summary tables (one row per model, e.g. Paper III's Table 2,
the LSM margin-vs-perplexity table, the ID profile), so adding a checkpoint later reruns that
checkpoint's jobs, the summaries and this table - never the other checkpoints' jobs.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the workflow calls checkpoint_steps while it builds the DAG
    pass

_STEP = re.compile(r"step(\d+)")


def checkpoint_steps(models: dict) -> dict[str, int]:
    """model name -> training step, for the entries whose ``revision`` is ``step<N>`` (Pythia's
    branch names)."""
    out = {}
    for name, spec in sorted(models.items()):
        m = _STEP.fullmatch(str(spec.get("revision") or ""))
        if m:
            out[name] = int(m.group(1))
    return out


def checkpoint_series(models: dict, steps: dict) -> dict[str, str]:
    """model name -> the run it is a checkpoint of (``repo_id``, else ``path``, else the name)."""
    return {m: str(models[m].get("repo_id") or models[m].get("path") or m) for m in steps}
