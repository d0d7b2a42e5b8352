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
fused QKV layouts only the value columns, ``architectures.qkv_columns(model, "v")``, through
``extract.hooks.HookSession.projection``):

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


def edit_hook(edit: ValueEdit, positions: torch.Tensor | None = None):
    """A capture hook (``llmgeom.extract.capture``) for point ``blocks.<l>.attn.hook_v`` that applies ``edit``
    to the values [B, T, D]: at every position (``positions`` None) or only at ``positions`` [B] (one per
    batch row). Fused QKV layouts: the capture API writes the edited values back into the value columns."""
    def hook(v, point):
        if positions is None:
            return apply_edit(v, edit)
        b = torch.arange(v.shape[0], device=v.device)
        pos = positions.to(v.device)
        new = v.clone()
        new[b, pos] = apply_edit(v[b, pos], edit)
        return new
    return hook


def value_edit_hooks(model, edits: Mapping[int, ValueEdit], positions: torch.Tensor | None = None) -> dict:
    """Capture hooks of ``edits`` (layer, 0-based or negative from the end -> :class:`ValueEdit`): point name
    ``blocks.<l>.attn.hook_v`` -> hook.

    Raises:
        IndexError: a layer outside the model.
    """
    from llmgeom.extract.capture import point_name

    n_layers = len(arch.decoder_layers(model))
    out = {}
    for layer, e in edits.items():
        li = layer if layer >= 0 else n_layers + layer
        if not 0 <= li < n_layers:
            raise IndexError(f"layer {layer} outside the model's {n_layers} layers")
        out[point_name("attn.hook_v", li)] = edit_hook(e, positions)
    return out


@contextlib.contextmanager
def value_edits(model, edits: Mapping[int, ValueEdit], positions: torch.Tensor | None = None):
    """Context manager: edit the value vectors of ``model`` at the given layers during forward passes.

    Args:
        model: a supported ``*ForCausalLM`` (any family in ``families.FAMILIES``).
        edits: layer index (0-based, negative from the end) -> :class:`ValueEdit`; several layers = a
            multi-layer run.
        positions: None = edit every token position; or a LongTensor [B] with one position per batch row
            (e.g. the last real token) to edit only there.

    The edits are hooks on the capture API's point ``blocks.<l>.attn.hook_v`` (``llmgeom.extract.capture``,
    on ``architectures.v_module``; modules that return a tensor or a tuple). For fused QKV layouts only the
    value columns are edited. Hooks are removed on exit, also when the body raises.

    Yields:
        the torch hook handles (one per edited layer).

    Raises:
        IndexError: a layer outside the model.

    Source: Paper III sec. 4.5-4.6.
    """
    from llmgeom.extract.capture import hooked

    with hooked(model, value_edit_hooks(model, edits, positions)) as st:
        yield st["handles"]
