"""Causal interventions on the entropy axis of the value vectors during SULA inference.

Paper III ("Geometric Scaling of Bayesian Inference in LLMs") sec. 4.5-4.6; DESIGN.md sec. 3.

Entropy axis. At layer l, take the last-token value vectors of the SULA ``main`` prompts
(``last_token/values[:, l]``, [n, D] with D = n_kv_heads * head_dim), standardize each coordinate
across prompts and take PC1 (unit loading w in standardized coordinates). The edit acts on raw value
vectors, so the axis is mapped to raw coordinates as the *readout* direction of the PC1 score:
``u ∝ w / sd`` (zero on constant coordinates), normalized to unit length. Then ``v . u`` is an affine
function of the PC1 score (same correlations). Sign: Pearson corr(v . u, H_model) >= 0.
``sigma`` = standard deviation (ddof 0) of ``v . u`` over the fit prompts, i.e. one standard deviation
of the PC1 score expressed along u.

Edits (applied to the output of ``architectures.v_module(model, l)`` during the forward pass; for
fused QKV layouts only the value columns, ``architectures.v_columns``):

* ``axis_cut``:   v -> v - (v . u) u
* ``axis_only``:  v -> (v . u) u
* ``axis_shift``: v -> v + c u  (c = +sigma or -sigma times ``shift_scale``)
* ``none``:       v -> v (the machinery runs; used to check that hooks change nothing)

Edits apply at every token position by default (``positions="all"``: the whole context's values carry
the edit, as if the layer's value projection had the axis removed/shifted), or at the final position
only (``positions="last"``, one position per batch row). Edits are computed in float32 and written back
in the model's dtype.

Control: a random unit axis, drawn with ``numpy.random.default_rng([seed, layer])``, orthogonalized
against u (Gram-Schmidt, twice) and normalized; it gets the same sigma for shifts.

Hooks are registered in a context manager and always removed, also when the forward pass raises.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch

from llmgeom.models import architectures as arch

EDIT_KINDS = ("none", "axis_cut", "axis_only", "axis_shift")
# config names -> (kind, sign of the shift in units of sigma)
EDIT_NAMES = {"axis_cut": ("axis_cut", 0.0), "axis_only": ("axis_only", 0.0),
              "axis_shift_plus": ("axis_shift", 1.0), "axis_shift_minus": ("axis_shift", -1.0)}
AXES = ("entropy", "random")


@dataclass(frozen=True)
class ValueEdit:
    """One edit of the value vectors at one layer: ``kind`` in :data:`EDIT_KINDS`, unit ``axis`` [D]
    (torch or numpy), ``shift`` in raw value units (axis_shift only)."""

    kind: str
    axis: torch.Tensor | np.ndarray | None = None
    shift: float = 0.0

    def __post_init__(self):
        if self.kind not in EDIT_KINDS:
            raise ValueError(f"edit kind {self.kind!r} not in {EDIT_KINDS}")
        if self.kind != "none" and self.axis is None:
            raise ValueError(f"edit {self.kind!r} needs an axis")


def apply_edit(v: torch.Tensor, edit: ValueEdit) -> torch.Tensor:
    """Apply ``edit`` to value vectors ``v`` [..., D]; returns a new tensor of v's dtype.

    axis_cut: v - (v.u)u; axis_only: (v.u)u; axis_shift: v + shift*u; none: a copy of v. Computed in
    float32 (float64 if v is float64).

    Raises:
        ValueError: axis length != D.

    Source: Paper III sec. 4.5 (edits of the entropy axis).
    """
    if edit.kind == "none":
        return v.clone()
    work = torch.float64 if v.dtype == torch.float64 else torch.float32
    u = torch.as_tensor(edit.axis).to(device=v.device, dtype=work).reshape(-1)
    if u.shape[0] != v.shape[-1]:
        raise ValueError(f"axis has length {u.shape[0]}, value vectors have {v.shape[-1]}")
    x = v.to(work)
    if edit.kind == "axis_shift":
        out = x + float(edit.shift) * u
    else:
        proj = (x @ u).unsqueeze(-1) * u
        out = x - proj if edit.kind == "axis_cut" else proj
    return out.to(v.dtype)


def _edit_output(t: torch.Tensor, edit: ValueEdit, cols: torch.Tensor | None,
                 positions: torch.Tensor | None) -> torch.Tensor:
    if cols is not None:
        cols = cols.to(t.device)
    if positions is None:
        if cols is None:
            return apply_edit(t, edit)
        new = t.clone()
        new[..., cols] = apply_edit(t[..., cols], edit)
        return new
    b = torch.arange(t.shape[0], device=t.device)
    pos = positions.to(t.device)
    new = t.clone()
    rows = new[b, pos]  # [B, out]
    if cols is None:
        rows = apply_edit(rows, edit)
    else:
        rows[:, cols] = apply_edit(rows[:, cols], edit)
    new[b, pos] = rows
    return new


def _make_hook(edit: ValueEdit, cols, positions):
    def hook(mod, args, out):
        if isinstance(out, (tuple, list)):
            new = _edit_output(out[0], edit, cols, positions)
            return type(out)([new, *out[1:]]) if isinstance(out, list) else (new,) + tuple(out[1:])
        return _edit_output(out, edit, cols, positions)
    return hook


@contextlib.contextmanager
def value_edits(model, edits: Mapping[int, ValueEdit], positions: torch.Tensor | None = None):
    """Context manager: edit the value vectors of ``model`` at the given layers during forward passes.

    Args:
        model: a supported ``*ForCausalLM`` (any family in ``architectures.FAMILIES``).
        edits: layer index (0-based, negative from the end) -> :class:`ValueEdit`; several layers = a
            multi-layer run.
        positions: None = edit every token position; or a LongTensor [B] with one position per batch row
            (e.g. the last real token) to edit only there.

    The hooks sit on ``architectures.v_module(model, layer)`` and accept modules that return a tensor or a
    tuple (first element edited, the rest passed through). For fused QKV layouts only the value columns
    (``architectures.v_columns``) are edited. Hooks are removed on exit, also when the body raises.

    Raises:
        IndexError: a layer outside the model.

    Source: Paper III sec. 4.5-4.6.
    """
    n_layers = len(arch.decoder_layers(model))
    cols = arch.v_columns(model)
    handles = []
    try:
        for layer, e in edits.items():
            li = layer if layer >= 0 else n_layers + layer
            if not 0 <= li < n_layers:
                raise IndexError(f"layer {layer} outside the model's {n_layers} layers")
            handles.append(arch.v_module(model, li).register_forward_hook(_make_hook(e, cols, positions)))
        yield handles
    finally:
        for h in handles:
            h.remove()
        handles.clear()
