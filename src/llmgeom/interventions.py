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
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from . import architectures as arch

EDIT_KINDS = ("none", "axis_cut", "axis_only", "axis_shift")
# config names -> (kind, sign of the shift in units of sigma)
EDIT_NAMES = {"axis_cut": ("axis_cut", 0.0), "axis_only": ("axis_only", 0.0),
              "axis_shift_plus": ("axis_shift", 1.0), "axis_shift_minus": ("axis_shift", -1.0)}
AXES = ("entropy", "random")
# an edited projection whose spread is below this fraction of sigma carries no entropy information:
# its correlation is reported as 0 (and flagged) instead of correlating rounding noise
DEGENERATE_FRACTION = 0.01


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


# --------------------------------------------------------------------------- axes


@dataclass
class EntropyAxis:
    """Entropy axis of one layer: unit ``u`` [D] (raw value coordinates), ``sigma`` (std of v.u over the
    fit prompts, raw value units), ``corr`` (Pearson corr(v.u, H_model) >= 0 on the fit prompts),
    ``pc1_var`` (explained-variance fraction of PC1 of the standardized values), ``n_fit``, ``flipped``."""

    layer: int
    u: np.ndarray
    sigma: float
    corr: float
    pc1_var: float
    n_fit: int
    flipped: bool


def _pearson(x, y) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def entropy_axis(values, h_model, layer: int = -1) -> EntropyAxis:
    """Fit the entropy axis of one layer.

    Args:
        values: [n_prompts, D] last-token value vectors of the SULA main prompts at this layer.
        h_model: [n_prompts] model label entropy H_model (bits) of the same prompts (sign reference).

    Returns:
        :class:`EntropyAxis` with unit u = normalized (w / sd) where w is the unit PC1 loading of the
        standardized values and sd the per-coordinate std (constant coordinates get 0); sign such that
        Pearson corr(values @ u, h_model) >= 0 (no flip if undefined); sigma = std(values @ u).

    Raises:
        ValueError: bad shapes, fewer than 3 prompts, non-finite values, no variance.

    Source: Paper III sec. 4.5 (entropy axis and sigma); DESIGN.md sec. 3 (Interventions).
    """
    from .geometry import _fit_pca, standardize_columns

    V = np.asarray(values, np.float64)
    h = np.asarray(h_model, np.float64)
    if V.ndim != 2 or h.shape != (V.shape[0],):
        raise ValueError(f"values must be [n, D] and h_model [n], got {V.shape} and {h.shape}")
    if V.shape[0] < 3:
        raise ValueError(f"the entropy axis needs at least 3 prompts, got {V.shape[0]}")
    if not np.any(np.ptp(V, axis=0) > 0):
        raise ValueError(f"layer {layer}: the last-token values are identical for every prompt (at layer 0 they "
                         "depend only on the final token ':'), so there is no entropy axis; choose a later layer")
    Z, kept = standardize_columns(V, True)
    pca = _fit_pca(Z, 1)
    w = np.asarray(pca.components_[0], np.float64)
    sd = V[:, kept].std(axis=0)
    u = np.zeros(V.shape[1])
    u[kept] = w / sd
    u /= np.linalg.norm(u)
    r = _pearson(V @ u, h)
    flipped = bool(np.isfinite(r) and r < 0)
    if flipped:
        u, r = -u, -r
    return EntropyAxis(layer=int(layer), u=u, sigma=float(np.std(V @ u)), corr=r,
                       pc1_var=float(pca.explained_variance_ratio_[0]), n_fit=int(V.shape[0]), flipped=flipped)


def random_axis(u, seed: int, layer: int) -> np.ndarray:
    """Random unit axis orthogonal to ``u`` [D]: Gaussian draw from ``default_rng([seed, layer])``,
    Gram-Schmidt against the normalized u twice, then normalized (float64).

    Raises:
        ValueError: D < 2 or u of zero length.

    Source: Paper III sec. 4.6 (matched random-axis control).
    """
    u = np.asarray(u, np.float64).ravel()
    nu = np.linalg.norm(u)
    if u.size < 2 or nu == 0:
        raise ValueError("random_axis needs a non-zero axis with at least 2 coordinates")
    u = u / nu
    g = np.random.default_rng([int(seed), int(layer)]).standard_normal(u.size)
    for _ in range(2):
        g = g - (g @ u) * u
    return g / np.linalg.norm(g)


def resolve_layers(spec: Sequence, n_layers: int) -> list[int]:
    """Layer names -> 0-based indices: "first" = 0, "middle" = n_layers // 2, "last" = n_layers - 1, ints
    (negative from the end). Order kept, duplicates removed.

    Raises:
        ValueError: unknown name or a layer outside the model.
    """
    out = []
    for x in spec:
        if isinstance(x, str):
            named = {"first": 0, "middle": n_layers // 2, "last": n_layers - 1}
            if x not in named:
                raise ValueError(f"layer {x!r}: use an integer or one of {sorted(named)}")
            li = named[x]
        else:
            li = int(x) if int(x) >= 0 else n_layers + int(x)
        if not 0 <= li < n_layers:
            raise ValueError(f"layer {x!r} outside the model's {n_layers} layers")
        if li not in out:
            out.append(li)
    return out


def intervention_conditions(single_layers: Sequence[int], multi_layers: Sequence[int] | None,
                            edits: Sequence[str]) -> list[dict]:
    """The conditions of one experiment: the unedited baseline, then for each run (one per single layer,
    plus one multi-layer run when ``multi_layers`` has >= 1 layer) x axis (entropy, random) x edit.

    Returns:
        list of dicts {condition, run, layers (tuple), axis, edit, kind, shift_sign}.
    """
    bad = [e for e in edits if e not in EDIT_NAMES]
    if bad:
        raise ValueError(f"unknown edits {bad}; valid: {sorted(EDIT_NAMES)}")
    runs = [(f"L{l}", (int(l),)) for l in single_layers]
    if multi_layers:
        runs.append(("multi_" + "+".join(f"L{l}" for l in multi_layers), tuple(int(l) for l in multi_layers)))
    out = [dict(condition="baseline", run="baseline", layers=(), axis="none", edit="none", kind="none",
                shift_sign=0.0)]
    for run, layers in runs:
        for axis in AXES:
            for e in edits:
                kind, sign = EDIT_NAMES[e]
                out.append(dict(condition=f"{run}/{axis}/{e}", run=run, layers=layers, axis=axis, edit=e,
                                kind=kind, shift_sign=sign))
    return out


# --------------------------------------------------------------------------- experiment (needs a model)


_MISSING = object()


def length_batches(lengths: Sequence[int], batch_size: int, min_fill: float = 0.75) -> list[list[int]]:
    """Indices grouped into batches of at most ``batch_size``, longest first; a new batch starts when a
    prompt is shorter than ``min_fill`` x the batch's longest (bounds padding waste; SULA prompts of one k
    have nearly the same length, so batches follow k)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out and len(out[-1]) < batch_size and lengths[i] >= min_fill * lengths[out[-1][0]]:
            out[-1].append(i)
        else:
            out.append([i])
    return out


@contextlib.contextmanager
def skip_layers(model, upto: int, output):
    """Context manager: decoder blocks 0..upto-1 do not compute; each returns ``output``, the recorded output
    of block ``upto - 1`` for the same batch (tensor or tuple, exactly as the block returned it).

    Exact when nothing before block ``upto`` changes (edits at layers >= upto only): the blocks that run
    see the same input as in the full forward pass. Used to rerun only the layers an edit can affect.
    The blocks' own ``forward`` is restored on exit, also when the body raises.
    """
    layers = arch.decoder_layers(model)
    saved = []
    try:
        for i in range(int(upto)):
            blk = layers[i]
            saved.append((blk, blk.__dict__.get("forward", _MISSING)))
            blk.forward = lambda *a, **k: output
        yield
    finally:
        for blk, old in saved:
            if old is _MISSING:
                blk.__dict__.pop("forward", None)
            else:
                blk.forward = old


def forward_probe(model, seqs: list[list[int]], candidates: list[list[int]], *, probe_layers: Sequence[int] = (),
                  record_blocks: Sequence[int] = (), head=None, pad_id: int = 0) -> dict:
    """One forward pass (inside whatever :func:`value_edits` / :func:`skip_layers` contexts are active).

    Returns:
        {"logp": [B, C] float32 log-probabilities (nats, full vocabulary) of the candidate tokens at the final
        real position, "values": {layer: [B, D] float32 value vectors at the final position as the rest of the
        model sees them (after any edit); absent for layers that did not run}, "blocks": {i: raw output of
        block i} for ``record_blocks``}.

    Raises:
        NonFiniteActivationError: non-finite logits.
    """
    from .extraction import NonFiniteActivationError, _first, _Float32Head, hooks, last_positions, pad_batch

    dev = next(model.parameters()).device
    head = head or _Float32Head(model)
    ids, mask, pos = pad_batch(seqs, pad_id, dev)
    last = last_positions(mask)
    b_idx = torch.arange(len(seqs), device=dev)
    cols = arch.v_columns(model)
    vals, blocks = {}, {}

    def vhook(layer):
        def fn(mod, args, out):
            o = _first(out)
            v = o if cols is None else o[..., cols.to(o.device)]
            vals[layer] = v[b_idx.to(o.device), last.to(o.device)].float()  # device_map="auto": blocks on several GPUs
        return fn

    def bhook(i):
        def fn(mod, args, out):
            blocks[i] = out
        return fn

    layers = arch.decoder_layers(model)
    handles: list = []
    with hooks(handles), torch.inference_mode():
        for layer in probe_layers:
            handles.append(arch.v_module(model, layer).register_forward_hook(vhook(layer)))
        for i in record_blocks:
            handles.append(layers[i].register_forward_hook(bhook(i)))
        out = arch.base_model(model)(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        hT = out.last_hidden_state
        logits = head(hT[b_idx.to(hT.device), last.to(hT.device)])
        if not torch.isfinite(logits).all():
            raise NonFiniteActivationError("non-finite logits at the final token during an intervention run")
        cand = torch.as_tensor(candidates, dtype=torch.long, device=logits.device).reshape(len(seqs), -1)
        logp = torch.log_softmax(logits, -1).gather(1, cand)
    return {"logp": logp.cpu().numpy(), "values": {k: v.cpu().numpy() for k, v in vals.items()}, "blocks": blocks}


def run_interventions(model, seqs: list[list[int]], candidates: list[list[int]], conditions: list[dict],
                      axes: Mapping[int, EntropyAxis], random_axes: Mapping[int, np.ndarray], *,
                      probe_layers: Sequence[int], shift_scale: float = 1.0, positions: str = "all",
                      batch_size: int = 32, pad_id: int = 0, skip: bool = True, log=print) -> dict:
    """Run every condition over the prompts and collect per-prompt outputs.

    Prompts are batched by length (:func:`length_batches`, at most ``batch_size``). Per batch, the unedited
    baseline runs first and records the output of block l_min - 1 for every first
    edited layer l_min; each edited condition then reruns only blocks l_min..L-1 (:func:`skip_layers`), which
    is exact because an edit at layer l cannot change anything before block l. ``skip=False`` runs every
    block for every condition (same numbers; used by the tests).

    Args:
        seqs: token ids per prompt; candidates: the two label token ids per prompt.
        conditions: from :func:`intervention_conditions`.
        axes / random_axes: per edited layer, the entropy axis and its random control (unit [D]).
        probe_layers: layers whose post-edit last-token values are projected on the entropy axis.
        shift_scale: axis_shift moves by shift_sign * shift_scale * sigma.
        positions: "all" (every token) or "last" (final real token of each prompt).

    Returns:
        {condition: {"logp": [n, 2] nats, "proj": {layer: [n]}}} (v.u_ent after the edit, raw units).

    Source: Paper III sec. 4.5-4.6.
    """
    from .extraction import _Float32Head

    if positions not in ("all", "last"):
        raise ValueError(f"positions must be 'all' or 'last', got {positions!r}")
    head = _Float32Head(model)
    n = len(seqs)
    out = {c["condition"]: {"logp": np.zeros((n, 2)), "proj": {l: np.zeros(n) for l in probe_layers}}
           for c in conditions}
    starts = {min(c["layers"]) for c in conditions if c["layers"]}
    record = sorted(l0 - 1 for l0 in starts if l0 > 0) if skip else []
    dev = next(model.parameters()).device
    t0 = time.time()
    for idx in length_batches([len(s) for s in seqs], batch_size):
        batch = [seqs[i] for i in idx]
        cands = [candidates[i] for i in idx]
        last = torch.tensor([len(s) - 1 for s in batch], dtype=torch.long, device=dev)
        base = None
        for c in sorted(conditions, key=lambda c: bool(c["layers"])):  # the baseline first
            edits = {}
            for l in c["layers"]:
                ax = axes[l]
                u = ax.u if c["axis"] == "entropy" else random_axes[l]
                edits[l] = ValueEdit(c["kind"], torch.as_tensor(u, dtype=torch.float32),
                                     c["shift_sign"] * shift_scale * ax.sigma)
            l0 = min(c["layers"]) if c["layers"] else 0
            use_skip = skip and base is not None and l0 > 0
            with contextlib.ExitStack() as st:
                st.enter_context(value_edits(model, edits, positions=last if positions == "last" else None))
                if use_skip:
                    st.enter_context(skip_layers(model, l0, base["blocks"][l0 - 1]))
                r = forward_probe(model, batch, cands, probe_layers=[l for l in probe_layers if not use_skip or l >= l0],
                                  record_blocks=record if not c["layers"] else (), head=head, pad_id=pad_id)
            if not c["layers"]:
                base = r
            rec = out[c["condition"]]
            rec["logp"][idx] = r["logp"]
            for l in probe_layers:
                v = r["values"].get(l, base["values"][l] if base is not None else None)
                rec["proj"][l][idx] = v.astype(np.float64) @ axes[l].u
    log(f"[interventions] {len(conditions)} conditions x {n} prompts in {time.time() - t0:.1f} s")
    return out


def intervention_experiment(model_dir, prompts_path, h5_path, *, model_name: str, layers=("middle", "last"),
                            multi_layers=("middle", "last"), edits=tuple(EDIT_NAMES), shift_scale: float = 1.0,
                            positions: str = "all", n_per_k: int | None = None, batch_size: int = 32,
                            seed: int = 0, dtype: str = "auto", device: str = "auto",
                            device_map: str | None = None, log=print):
    """Fit entropy axes on the SULA main activations, then run the baseline and every edit.

    Args:
        model_dir: prepared model; prompts_path: ``resources/prompts/sula/{model}/main.jsonl``;
        h5_path: ``results/{model}/activations/sula_main.h5`` (extracted from the same prompt file).
        layers: single-layer runs ("first"/"middle"/"last"/ints); multi_layers: one run editing all of
            them at once (empty = none).
        n_per_k: run on the first n_per_k prompts of each k (default all); the axes are fit on all.

    Returns:
        (per_prompt DataFrame, axes DataFrame, arrays dict for ``numpy.savez``). per_prompt has one row per
        condition and prompt: model, condition, run, layers ("15+29"), axis, edit, shift_sigmas, positions,
        prompt, k, n_L1, n_L2, h_bayes_bits, logp_l1, logp_l2 (nats), p_model, h_model_bits, label_mass, and
        proj_L{l} (post-edit v.u_ent at probe layer l, raw units). axes has layer, sigma, corr_fit, pc1_var,
        n_fit, flipped, random_dot_u (|u . r|), random_norm.

    Raises:
        StoreError: the activation file is not for this model / prompt file.

    Source: Paper III sec. 4.5-4.6.
    """
    import pandas as pd

    from .extraction import tokenize_prompts
    from .models import load_prepared
    from .prompts import read_prompt_set
    from .store import open_activations
    from .sula import model_label_entropy

    records, sha = read_prompt_set(prompts_path)
    with open_activations(h5_path, model=model_name, prompt_set_sha256=sha) as f:
        V = f["last_token/values"][:]
        lp_fit = f["next_token/candidate_logprobs"][:].astype(np.float64)
    n_layers = V.shape[1]
    single = resolve_layers(layers, n_layers)
    multi = resolve_layers(multi_layers, n_layers) if multi_layers else []
    _, h_fit = model_label_entropy(lp_fit[:, 0], lp_fit[:, 1])
    edited = sorted(set(single) | set(multi))
    axes = {l: entropy_axis(V[:, l, :], h_fit, layer=l) for l in edited}
    rnd = {l: random_axis(axes[l].u, seed, l) for l in edited}
    probe = sorted(set(edited) | {n_layers - 1})
    for l in probe:
        if l not in axes:
            axes[l] = entropy_axis(V[:, l, :], h_fit, layer=l)

    meta = [r.get("meta", {}) for r in records]
    keep = [i for i, m in enumerate(meta) if n_per_k is None or int(m.get("i", 0)) < n_per_k]
    model, tok = load_prepared(model_dir, dtype=dtype, attn="sdpa", device=device, device_map=device_map)
    s = arch.summarize(model.config)
    seqs = tokenize_prompts(tok, [records[i]["text"] for i in keep], [records[i].get("id", str(i)) for i in keep],
                            max_tokens=None, truncate=False, context=s.max_positions)
    cands = [meta[i]["label_token_ids"] for i in keep]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    conds = intervention_conditions(single, multi, edits)
    log(f"[interventions] {model_name}: layers {single}, multi {multi}, {len(conds)} conditions, "
        f"{len(keep)} prompts, positions={positions}, dtype {model.dtype}, device {next(model.parameters()).device}")
    res = run_interventions(model, seqs, cands, conds, axes, rnd, probe_layers=probe, shift_scale=shift_scale,
                            positions=positions, batch_size=batch_size, pad_id=pad_id, log=log)
    rows = []
    for c in conds:
        lp = res[c["condition"]]["logp"]
        p, h = model_label_entropy(lp[:, 0], lp[:, 1])
        d = {"model": model_name, "condition": c["condition"], "run": c["run"],
             "layers": "+".join(str(l) for l in c["layers"]), "axis": c["axis"], "edit": c["edit"],
             "shift_sigmas": c["shift_sign"] * shift_scale, "positions": positions,
             "prompt": [records[i].get("id", str(i)) for i in keep], "k": [meta[i]["k"] for i in keep],
             "n_L1": [meta[i]["n_L1"] for i in keep], "n_L2": [meta[i]["n_L2"] for i in keep],
             "h_bayes_bits": [meta[i]["h_bayes_bits"] for i in keep], "logp_l1": lp[:, 0], "logp_l2": lp[:, 1],
             "p_model": p, "h_model_bits": h, "label_mass": np.exp(lp[:, 0]) + np.exp(lp[:, 1])}
        for l in probe:
            d[f"proj_L{l}"] = res[c["condition"]]["proj"][l]
        rows.append(pd.DataFrame(d))
    per_prompt = pd.concat(rows, ignore_index=True)
    ax_rows = [dict(model=model_name, layer=l, edited=l in edited, sigma=a.sigma, corr_fit=a.corr, pc1_var=a.pc1_var,
                    n_fit=a.n_fit, flipped=a.flipped,
                    random_dot_u=float(abs(rnd[l] @ a.u)) if l in rnd else np.nan,
                    random_norm=float(np.linalg.norm(rnd[l])) if l in rnd else np.nan)
               for l, a in sorted(axes.items())]
    arrays = {f"u_L{l}": a.u for l, a in axes.items()}
    arrays.update({f"random_L{l}": r for l, r in rnd.items()})
    return per_prompt, pd.DataFrame(ax_rows), arrays


# --------------------------------------------------------------------------- summary (tables only)


def axis_entropy_corr(proj, h_model, sigma: float) -> tuple[float, bool]:
    """Pearson corr(v.u, H_model) after an edit; (0.0, True) when the projection's spread is below
    ``DEGENERATE_FRACTION * sigma`` (e.g. after axis_cut on the entropy axis: no entropy information left
    on the axis, rather than correlating rounding noise); NaN if H_model is constant."""
    proj = np.asarray(proj, np.float64)
    if np.std(proj) <= DEGENERATE_FRACTION * sigma:
        return 0.0, True
    return _pearson(proj, h_model), False


def _cond_stats(hm, hb, proj_e, proj_f, sig_e, sig_f) -> dict:
    from .sula import sula_stats

    st = sula_stats(hm, hb)
    ce, de = axis_entropy_corr(proj_e, hm, sig_e) if proj_e is not None else (np.nan, False)
    cf, df_ = axis_entropy_corr(proj_f, hm, sig_f)
    return {"mae_bits": st["mae_bits"], "pearson_r": st["pearson_r"], "axis_corr_edited": ce,
            "axis_corr_final": cf, "degenerate_edited": de, "degenerate_final": df_,
            "mean_h_model_bits": st["mean_h_model_bits"]}


def intervention_summary(per_prompt, axes, *, n_boot: int = 200, ci: float = 0.95, seed: int = 0):
    """One row per condition: SULA MAE / r and the axis-entropy correlation after the edit, their changes
    against the unedited baseline, and paired percentile-bootstrap CIs over prompts for the changes.

    Args:
        per_prompt, axes: the DataFrames of :func:`intervention_experiment` (or read back from CSV).
        n_boot: bootstrap resamples (the same resampled prompts for the condition and the baseline).

    Returns:
        DataFrame with model, run, layers, axis, edit, shift_sigmas, positions, n, probe_layer_edited (the
        last edited layer), probe_layer_final (the model's last layer), mae_bits, pearson_r,
        axis_corr_edited / axis_corr_final (Pearson corr(v.u_ent, H_model) at the probe layer after the
        edit; 0 and degenerate_* = True when the projection is (numerically) constant), mean_h_model_bits,
        mean_abs_dh_model_bits (mean |H_model(edit) - H_model(baseline)| per prompt), mean_label_mass,
        baseline values (*_base), and delta_* = edited - baseline with delta_*_lo / _hi bounds.

    Raises:
        ValueError: no baseline rows, or n_boot < 1.

    Source: Paper III sec. 4.5-4.6.
    """
    import pandas as pd

    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    base = per_prompt[per_prompt.condition == "baseline"].set_index("prompt")
    if base.empty:
        raise ValueError("no baseline rows in the intervention results")
    sig = dict(zip(axes.layer, axes.sigma))
    final = int(axes.layer.max())
    rng = np.random.default_rng(seed)
    n = len(base)
    boot_idx = rng.integers(0, n, size=(n_boot, n))
    q = [50 * (1 - ci), 50 * (1 + ci)]
    rows = []
    for cond, g in per_prompt.groupby("condition", sort=False):
        g = g.set_index("prompt").loc[base.index]
        # a column of single layers reads back from CSV as float ("1.0"); "1+2" stays a string
        layers = [int(float(x)) for x in str(g.layers.iloc[0]).split("+") if x not in ("", "nan")]
        le = layers[-1] if layers else None
        hb = base.h_bayes_bits.to_numpy(np.float64)
        hm, hm0 = g.h_model_bits.to_numpy(np.float64), base.h_model_bits.to_numpy(np.float64)
        pf, pf0 = g[f"proj_L{final}"].to_numpy(np.float64), base[f"proj_L{final}"].to_numpy(np.float64)
        pe = g[f"proj_L{le}"].to_numpy(np.float64) if le is not None else None
        pe0 = base[f"proj_L{le}"].to_numpy(np.float64) if le is not None else None
        args = (sig.get(le, np.nan), sig[final])
        st = _cond_stats(hm, hb, pe, pf, *args)
        st0 = _cond_stats(hm0, hb, pe0, pf0, *args)
        keys = ("mae_bits", "pearson_r", "axis_corr_edited", "axis_corr_final")
        boots = np.full((n_boot, len(keys)), np.nan)
        for b in range(n_boot):
            ix = boot_idx[b]
            s1 = _cond_stats(hm[ix], hb[ix], pe[ix] if pe is not None else None, pf[ix], *args)
            s0 = _cond_stats(hm0[ix], hb[ix], pe0[ix] if pe0 is not None else None, pf0[ix], *args)
            boots[b] = [s1[k] - s0[k] for k in keys]
        row = dict(model=g.model.iloc[0], run=g.run.iloc[0], layers=str(g.layers.iloc[0]) if layers else "",
                   axis=g.axis.iloc[0], edit=g.edit.iloc[0], shift_sigmas=float(g.shift_sigmas.iloc[0]),
                   positions=g.positions.iloc[0], n=n, probe_layer_edited=le if le is not None else np.nan,
                   probe_layer_final=final, **st,
                   mean_abs_dh_model_bits=float(np.mean(np.abs(hm - hm0))),
                   mean_label_mass=float(g.label_mass.mean()))
        for k in keys:
            row[f"{k}_base"] = st0[k]
            row[f"delta_{k}"] = st[k] - st0[k]
            col = boots[:, keys.index(k)]
            ok = np.isfinite(col)
            lo, hi = np.percentile(col[ok], q) if ok.any() else (np.nan, np.nan)
            row[f"delta_{k}_lo"], row[f"delta_{k}_hi"] = float(lo), float(hi)
        row.update(n_boot=n_boot, ci=ci, seed=seed)
        rows.append(row)
    return pd.DataFrame(rows)


def save_axes(arrays: dict, path) -> None:
    """Write the axes (u_L{l}, random_L{l}) as a compressed .npz, atomically."""
    import os
    import tempfile
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial.npz", dir=path.parent)
    os.close(fd)
    try:
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
