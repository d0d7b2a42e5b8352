"""Disk space of an extraction (``extract.forward.extract_to_hdf5``): the estimate checked before any forward pass,
the space held back while the partial file is written, and the error of a file system that fills meanwhile.

The file's size is estimated from the HDF5 contract (``core.store.estimate_nbytes`` of the plan's
``contract_shapes``: shapes x dtypes x prompts, plus the strings); a plan ``p`` here is ``extract.forward._Plan``
(its ``nbytes()``, ``batch_nbytes(j)``, ``batches``, ``seqs``, ``model_name``, ``set_name``). The errors are
``core.io.DiskFullError`` (docs/troubleshooting.md, "Full disks").
"""

from __future__ import annotations

from pathlib import Path

from llmgeom.core.io import DiskFullError, disk_full_error, free_bytes, human_bytes, partial_path, reserve_path
from llmgeom.core.writer import ActivationWriter


#: space held back beside a partial activation file (``ActivationWriter``'s reserve): what HDF5 may still have to
#: write when the disk fills (two of the largest batches), plus this, for its metadata
RESERVE_MARGIN = 1 << 20


def reserve_bytes(p) -> int:
    """Bytes held back beside the partial file of plan ``p`` (``ActivationWriter(reserve_bytes=)``)."""
    return 2 * max((p.batch_nbytes(j) for j in range(len(p.batches))), default=0) + RESERVE_MARGIN


def check_space(out_path, p) -> dict:
    """Step "estimate": the file's estimated size (``p.nbytes()``, from the contract's shapes x dtypes x
    prompts) and the reserve, against the room on the output's file system (free space plus what a partial file
    and reserve of an earlier run already hold). Returns the numbers (bytes). Raises DiskFullError with them,
    before any forward pass, when they do not fit."""
    out = Path(out_path)
    held = sum(q.stat().st_size for q in (partial_path(out), reserve_path(out)) if q.is_file())
    need = dict(file=p.nbytes(), reserve=reserve_bytes(p), free=free_bytes(out), held=held)
    if need["free"] + held < need["file"] + need["reserve"]:
        raise disk_full_error(
            out, need=need["file"] + need["reserve"],
            what=f"Nothing was computed: the activation file of {p.model_name} on {p.set_name} takes about "
                 f"{human_bytes(need['file'])} ({len(p.seqs)} prompts; the contract's shapes x dtypes), and "
                 f"{human_bytes(need['reserve'])} are held back while it is written"
                 + (f"; a partial file of an earlier run holds {human_bytes(held)}" if held else "") + ".",
            fix="free that much there (or move results/ to a larger file system), then rerun the same command")
    return need


def disk_full(w: ActivationWriter, p) -> DiskFullError:
    """The file system filled during a batch's write or commit, or the final commit: the partial file is closed
    with the batches committed so far (:meth:`ActivationWriter.close_after_disk_full`); the error names it, the
    free space, the bytes the next batch and the rest of the file need, and what the rerun does."""
    try:
        done, recorded = set(w.done_batches().tolist()), True
    except (KeyError, OSError, RuntimeError, ValueError):  # the commit had removed the record of the batches
        done, recorded = set(), False
    todo = [j for j in range(len(p.batches)) if j not in done] if recorded else []
    free = free_bytes(w.tmp)  # before the reserve is given back: the room the writer found
    problem = w.close_after_disk_full()
    rest = max(p.nbytes() + reserve_bytes(p) - (w.tmp.stat().st_size if w.tmp.exists() else 0), 0)
    nxt = (f"the next batch ({todo[0] + 1} of {len(p.batches)}) needs about {human_bytes(p.batch_nbytes(todo[0]))}"
           if todo else "every batch was written; the commit needs room for the file's last records")
    if not recorded:
        keeps = "The commit had begun (the record of the batches removed): a rerun extracts the file again"
    elif problem is None:
        keeps = (f"The partial file keeps the {len(done)} committed batches (each with its sha256); a rerun of the "
                 "same extraction verifies them and resumes from there")
    else:
        keeps = (f"The partial file was kept, but {problem}: a rerun checks it, resumes if its committed batches "
                 "verify against their sha256, and otherwise says so and starts over")
    return disk_full_error(w.tmp, need=rest, free=free,
                           what=f"({nxt}; the rest of the file and the space held back while it is written about "
                                f"{human_bytes(rest)}.) {keeps}.",
                           fix="free that much there (or move results/ to a larger file system) and rerun the "
                               "same command")
