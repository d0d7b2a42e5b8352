"""Running the interventions (Paper III sec. 4.5-4.6): SULA prompts through the model with value edits
at chosen layers, recording the label log-probs and the axis projections.

May import: torch, llmgeom.models, llmgeom.extract, llmgeom.interventions, llmgeom.measures, llmgeom.core.
"""

from __future__ import annotations

import contextlib
import time
from typing import Mapping, Sequence

import numpy as np
import torch

from llmgeom.core.layers import select_layers
from llmgeom.core.not_applicable import NO_ATTENTION_LAYERS
from llmgeom.core.progress import progress
from llmgeom.core.store import DS
from llmgeom.interventions.axes import EntropyAxis, entropy_axis, random_axis
from llmgeom.interventions.edits import AXES, EDIT_NAMES, ValueEdit, value_edit_hooks
from llmgeom.models import architectures as arch
from llmgeom.models import families


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
                  record_blocks: Sequence[int] = (), head=None, pad_id: int = 0,
                  edits: Mapping | None = None) -> dict:
    """One forward pass through the capture API (``llmgeom.extract.capture.run``), inside whatever
    :func:`skip_layers` context is active.

    Args:
        edits: capture hooks that edit (point name -> hook, e.g. ``edits.value_edit_hooks``); they run
            before the reads, so the probes see the edited values.

    Returns:
        {"logp": [B, C] float32 log-probabilities (nats, full vocabulary) of the candidate tokens at the final
        real position, "values": {layer: [B, D] float32 value vectors at the final position as the rest of the
        model sees them (after any edit); absent for layers that did not run}, "blocks": {i: raw output of
        block i} for ``record_blocks``}.

    Raises:
        NonFiniteActivationError: non-finite logits.
    """
    from llmgeom.extract import capture
    from llmgeom.extract.batch import NonFiniteActivationError

    batch = capture.make_batch(model, seqs, pad_id)
    dev = batch.ids.device
    vals, blocks = {}, {}

    def read_v(v, pt):
        vals[pt.layer] = capture.rows_at(v, batch.rows, batch.last, dev)  # device_map="auto": blocks on several GPUs

    def record(h, pt):
        blocks[pt.layer] = pt.raw

    hooks: dict = {k: [fn] for k, fn in (edits or {}).items()}
    for layer in probe_layers:
        hooks.setdefault(capture.point_name("attn.hook_v", layer), []).append(read_v)
    for i in record_blocks:
        hooks.setdefault(capture.point_name("hook_resid_post", i), []).append(record)
    out = capture.run(model, batch, hooks, head=head)
    if not torch.isfinite(out.logits).all():
        raise NonFiniteActivationError("non-finite logits at the final token during an intervention run")
    logp = capture.candidate_logprobs(out.logits, candidates)
    return {"logp": logp.cpu().numpy(), "values": {k: v.cpu().numpy() for k, v in vals.items()}, "blocks": blocks}


def run_interventions(model, seqs: list[list[int]], candidates: list[list[int]], conditions: list[dict],
                      axes: Mapping[int, EntropyAxis], random_axes: Mapping[int, np.ndarray], *,
                      probe_layers: Sequence[int], shift_scale: float, positions: str, batch_size: int,
                      pad_id: int = 0, skip: bool = True, log=print) -> dict:
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
        {condition: {"logp": [n, 2] nats, "proj": {layer: [n]}, "final_values": [n, D]}} (v.u_ent after the edit,
        raw units; final_values: the post-edit last-token values at the last probe layer, for the PC1 recomputed
        on them, :func:`intervention_experiment`).

    Source: Paper III sec. 4.5-4.6.
    """
    from llmgeom.extract.capture import Float32Head

    if positions not in ("all", "last"):
        raise ValueError(f"positions must be 'all' or 'last', got {positions!r}")
    head = Float32Head(model)
    n = len(seqs)
    last_probe = max(probe_layers)
    out = {c["condition"]: {"logp": np.zeros((n, 2)), "proj": {l: np.zeros(n) for l in probe_layers},
                            "final_values": np.zeros((n, axes[last_probe].u.size))} for c in conditions}
    starts = {min(c["layers"]) for c in conditions if c["layers"]}
    record = sorted(l0 - 1 for l0 in starts if l0 > 0) if skip else []
    dev = next(model.parameters()).device
    t0 = time.time()
    bar = progress(total=n * len(conditions), desc=f"interventions ({len(conditions)} conditions)",
                   unit="forward")
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
                if use_skip:
                    st.enter_context(skip_layers(model, l0, base["blocks"][l0 - 1]))
                r = forward_probe(model, batch, cands, probe_layers=[l for l in probe_layers if not use_skip or l >= l0],
                                  record_blocks=record if not c["layers"] else (), head=head, pad_id=pad_id,
                                  edits=value_edit_hooks(model, edits, positions=last if positions == "last" else None))
            bar.update(len(idx))
            if not c["layers"]:
                base = r
            rec = out[c["condition"]]
            rec["logp"][idx] = r["logp"]
            for l in probe_layers:
                v = r["values"].get(l, base["values"][l] if base is not None else None)
                rec["proj"][l][idx] = v.astype(np.float64) @ axes[l].u
                if l == last_probe:
                    rec["final_values"][idx] = v
    bar.close()
    log(f"[interventions] {len(conditions)} conditions x {n} prompts in {time.time() - t0:.1f} s")
    return out


def recomputed_pc1(values, h_model, layer: int) -> np.ndarray:
    """PC1 scores of the post-edit values, the PCA recomputed on them.

    After ``axis_cut`` the projection on the fitted axis is constant by construction; whether the edit removed
    the entropy geometry, or another direction of the same values still orders the prompts by entropy, is told
    by the PC1 of the edited values themselves. Fitted as the entropy axis is
    (:func:`llmgeom.interventions.axes.entropy_axis`: standardized values, sign so that corr(score, H_model) >= 0).

    Args:
        values: [n, D] post-edit last-token values at ``layer``; h_model: [n] the post-edit model entropy (bits).

    Returns:
        [n] float64 scores v.u (raw units); NaN everywhere when the values do not vary (nothing to fit).
    """
    try:
        ax = entropy_axis(values, h_model, layer=layer)
    except ValueError:
        return np.full(len(values), np.nan)
    return np.asarray(values, np.float64) @ ax.u


#: the per-prompt table's columns before its per-layer ones (proj_L{l} per probe layer, pc1_recomputed_L{last})
PER_PROMPT_COLUMNS = ["model", "condition", "run", "layers", "axis", "edit", "shift_sigmas", "positions", "prompt", "k",
                      "n_L1", "n_L2", "h_bayes_bits", "logp_l1", "logp_l2", "p_model", "h_model_bits", "label_mass"]
#: the axes table's columns
AXES_COLUMNS = ["model", "layer", "edited", "sigma", "corr_fit", "pc1", "pc1_sign", "n_fit", "flipped", "random_dot_u",
                "random_norm"]


def not_applicable_outputs(reason: str):
    """The outputs of :func:`intervention_experiment` for a model without attention layers (nothing to edit): the
    per-prompt and axes tables with no rows, their usual columns (:data:`PER_PROMPT_COLUMNS`, :data:`AXES_COLUMNS`;
    no probe layer, so no proj_L* / pc1_recomputed_L*) and a ``not_applicable`` column, the reason also in their
    ``attrs["not_applicable"]``; no vectors (``{}``: :func:`save_axes` writes an .npz without arrays).

    The ``not_applicable`` column marks them: ``analyses.interventions.intervention_summary`` of such tables is one
    row saying why (the tables of attention models never have the column)."""
    import pandas as pd

    per = pd.DataFrame([], columns=PER_PROMPT_COLUMNS + ["not_applicable"])
    axes = pd.DataFrame([], columns=AXES_COLUMNS + ["not_applicable"])
    per.attrs["not_applicable"] = axes.attrs["not_applicable"] = reason
    return per, axes, {}


def intervention_experiment(model_dir, prompts_path, h5_path, *, model_name: str, layers, multi_layers, edits,
                            shift_scale: float, positions: str, n_per_k: int | None, batch_size: int, seed: int,
                            dtype: str, device: str, device_map: str | None, reuse_model: bool = False, log=print):
    """Fit entropy axes on the SULA main activations, then run the baseline and every edit.

    ``reuse_model``: take / keep the model in this process's cache (``load_prepared(reuse=True)``).

    Args:
        model_dir: prepared model; prompts_path: ``resources/prompts/sula/{model}/main.jsonl``;
        h5_path: ``results/{model}/activations/sula_main.h5`` (extracted from the same prompt file).
        layers: single-layer runs ("first"/"middle"/"last"/ints); multi_layers: one run editing all of
            them at once (empty = none).
        n_per_k: run on the first n_per_k prompts of each k (None: all); the axes are fit on all.

    Returns:
        (per_prompt DataFrame, axes DataFrame, arrays dict for ``numpy.savez``). per_prompt has one row per
        condition and prompt: model, condition, run, layers ("15+29"), axis, edit, shift_sigmas, positions,
        prompt, k, n_L1, n_L2, h_bayes_bits, logp_l1, logp_l2 (nats), p_model, h_model_bits, label_mass, and
        proj_L{l} (post-edit v.u_ent at probe layer l, raw units), pc1_recomputed_L{last} (:func:`recomputed_pc1`
        of the post-edit values at the model's last layer). axes has layer, sigma, corr_fit, pc1, pc1_sign,
        n_fit, flipped, random_dot_u (|u . r|), random_norm.

        A model without attention layers (a state-space model: the file's ``attention_layers`` is []) has no values
        to edit: :func:`not_applicable_outputs` (both tables without rows, their ``not_applicable`` column and
        ``attrs`` giving the reason, :data:`llmgeom.core.not_applicable.NO_ATTENTION_LAYERS`; no vectors); the model is not
        loaded.

    Raises:
        StoreError: the activation file is not for this model / prompt file.
        ValueError: an integer layer in ``layers`` / ``multi_layers`` without attention (hybrid models: the
            file's ``attention_layers``; the names "first" / "middle" / "last" pick among those); a file with
            attention layers but no values.

    Source: Paper III sec. 4.5-4.6.
    """
    import pandas as pd

    from llmgeom.extract.forward import tokenize_prompts
    from llmgeom.models.loading import load_prepared
    from llmgeom.prompts.io import CANDIDATES_KEY, read_prompt_set

    records, sha = read_prompt_set(prompts_path)
    fit = _fit_axes(h5_path, sha, model_name=model_name, layers=layers, multi_layers=multi_layers, seed=seed, log=log)
    if fit is None:  # a state-space model: no values to edit; the tables say so
        return not_applicable_outputs(NO_ATTENTION_LAYERS)
    single, multi, edited, axes, rnd, probe = fit
    meta = [r.get("meta", {}) for r in records]
    keep = [i for i, m in enumerate(meta) if n_per_k is None or int(m.get("i", 0)) < n_per_k]
    model, tok = load_prepared(model_dir, dtype=dtype, attn="sdpa", device=device, device_map=device_map,
                               reuse=reuse_model)
    s = families.summarize(model.config)
    seqs = tokenize_prompts(tok, [records[i]["text"] for i in keep], [records[i].get("id", str(i)) for i in keep],
                            max_tokens=None, truncate=False, context=s.max_positions)
    cands = [meta[i][CANDIDATES_KEY] for i in keep]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    conds = intervention_conditions(single, multi, edits)
    log(f"[interventions] {model_name}: layers {single}, multi {multi}, {len(conds)} conditions, "
        f"{len(keep)} prompts, positions={positions}, dtype {model.dtype}, device {next(model.parameters()).device}")
    res = run_interventions(model, seqs, cands, conds, axes, rnd, probe_layers=probe, shift_scale=shift_scale,
                            positions=positions, batch_size=batch_size, pad_id=pad_id, log=log)
    kept = {"prompt": [records[i].get("id", str(i)) for i in keep],
            **{k: [meta[i][k] for i in keep] for k in ("k", "n_L1", "n_L2", "h_bayes_bits")}}
    per_prompt = pd.concat([_condition_rows(c, res[c["condition"]], kept, probe, model_name=model_name,
                                            shift_scale=shift_scale, positions=positions) for c in conds],
                           ignore_index=True)
    ax_rows = [dict(model=model_name, layer=l, edited=l in edited, sigma=a.sigma, corr_fit=a.corr, pc1=a.pc1, pc1_sign=a.sign,
                    n_fit=a.n_fit, flipped=a.flipped,
                    random_dot_u=float(abs(rnd[l] @ a.u)) if l in rnd else np.nan,
                    random_norm=float(np.linalg.norm(rnd[l])) if l in rnd else np.nan)
               for l, a in sorted(axes.items())]
    arrays = {f"u_L{l}": a.u for l, a in axes.items()}
    arrays.update({f"random_L{l}": r for l, r in rnd.items()})
    return per_prompt, pd.DataFrame(ax_rows), arrays


def _fit_axes(h5_path, sha: str, *, model_name: str, layers, multi_layers, seed: int, log):
    """Step 1 of :func:`intervention_experiment`: the edited layers and the entropy / random axes fit on the SULA
    main activations, or None for a model without attention layers. Returns (single, multi, edited, axes, random
    axes, probe layers).

    Raises:
        StoreError / ValueError: as :func:`intervention_experiment` says."""
    from llmgeom.core.store import attention_layers, open_activations
    from llmgeom.measures.bayes import model_label_entropy

    with open_activations(h5_path, model=model_name, prompt_set_sha256=sha) as f:
        with_attention = attention_layers(f)
        if not with_attention:
            log(f"[interventions] {model_name}: not applicable, {NO_ATTENTION_LAYERS}")
            return None
        if DS.LAST_TOKEN_VALUES not in f:
            raise ValueError(f"{h5_path}: no {DS.LAST_TOKEN_VALUES} although model {model_name!r} has attention "
                             f"layers {with_attention}; re-extract it")
        V = f[DS.LAST_TOKEN_VALUES][:]  # NaN at the layers without attention (hybrid models)
        lp_fit = f[DS.NEXT_TOKEN_CANDIDATE_LOGPROBS][:].astype(np.float64)
    n_layers = V.shape[1]
    # hybrid models: the names pick among the layers with attention (the only ones with values), integers must be
    # such layers; attention-only models: as select_layers without ``among``
    single = select_layers(layers, n_layers, key="interventions.layers", among=with_attention)
    multi = (select_layers(multi_layers, n_layers, key="interventions.multi_layers", among=with_attention)
             if multi_layers else [])
    _, h_fit = model_label_entropy(lp_fit[:, 0], lp_fit[:, 1])
    edited = sorted(set(single) | set(multi))
    axes = {l: entropy_axis(V[:, l, :], h_fit, layer=l) for l in edited}
    rnd = {l: random_axis(axes[l].u, seed, l) for l in edited}
    probe = sorted(set(edited) | {with_attention[-1]})  # the last layer with values (n_layers - 1 unless a hybrid)
    for l in probe:
        if l not in axes:
            axes[l] = entropy_axis(V[:, l, :], h_fit, layer=l)
    return single, multi, edited, axes, rnd, probe


def _condition_rows(c: dict, res: dict, kept: dict, probe: list, *, model_name: str, shift_scale: float,
                    positions: str):
    """The per-prompt rows of one condition (:func:`intervention_experiment`'s per_prompt table)."""
    import pandas as pd

    from llmgeom.measures.bayes import model_label_entropy

    lp = res["logp"]
    p, h = model_label_entropy(lp[:, 0], lp[:, 1])
    d = {"model": model_name, "condition": c["condition"], "run": c["run"],
         "layers": "+".join(str(l) for l in c["layers"]), "axis": c["axis"], "edit": c["edit"],
         "shift_sigmas": c["shift_sign"] * shift_scale, "positions": positions, **kept,
         "logp_l1": lp[:, 0], "logp_l2": lp[:, 1], "p_model": p, "h_model_bits": h,
         "label_mass": np.exp(lp[:, 0]) + np.exp(lp[:, 1])}
    for l in probe:
        d[f"proj_L{l}"] = res["proj"][l]
    d[f"pc1_recomputed_L{probe[-1]}"] = recomputed_pc1(res["final_values"], h, probe[-1])
    return pd.DataFrame(d)


def save_axes(arrays: dict, path) -> None:
    """Write the axes (u_L{l}, random_L{l}) as a compressed .npz, atomically (none for a model without attention
    layers: a valid .npz without arrays, ``numpy.load(path).files == []``)."""
    from llmgeom.core.io import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)


def write_intervention_outputs(result, per_prompt_path, axes_path, vectors_path) -> None:
    """Write what :func:`intervention_experiment` returned to the rule's outputs, each atomically: the two tables
    (CSV, ``llmgeom.core.io.write_table``) and the axes (:func:`save_axes`); the axes table also to stdout (the
    job's log). The model server's writer of the "intervene" task (``pipeline.model_server.TASK_WRITERS``)."""
    from llmgeom.core.io import write_table

    per_prompt, axes, arrays = result
    write_table(per_prompt, per_prompt_path)
    write_table(axes, axes_path)
    save_axes(arrays, vectors_path)
    print(axes.to_string(index=False), flush=True)
