"""sula_interventions.csv: summary of the causal interventions on the entropy axis (Paper III sec. 4.5-4.6):
axis-entropy correlation, SULA MAE / r per condition, with bootstrap intervals. Numpy/pandas only; never torch.
"""

from __future__ import annotations

import numpy as np

from llmgeom.core.not_applicable import NO_ATTENTION_LAYERS
from llmgeom.core.stats import bias_corrected, bootstrap_interval, pearson, replicates_text

# an edited projection whose spread is below this fraction of sigma carries no entropy information:
# its correlation is reported as 0 (and flagged) instead of correlating rounding noise
DEGENERATE_FRACTION = 0.01


# --------------------------------------------------------------------------- summary (tables only)


def axis_entropy_corr(proj, h_model, sigma: float) -> tuple[float, bool]:
    """Pearson corr(v.u, H_model) after an edit; (0.0, True) when the projection's spread is below
    ``DEGENERATE_FRACTION * sigma`` (e.g. after axis_cut on the entropy axis: no entropy information left
    on the axis, rather than correlating rounding noise); NaN if H_model is constant."""
    proj = np.asarray(proj, np.float64)
    if np.std(proj) <= DEGENERATE_FRACTION * sigma:
        return 0.0, True
    return pearson(proj, h_model)[0], False


def _cond_stats(hm, hb, proj_e, proj_f, sig_e, sig_f, pc1_f=None) -> dict:
    from llmgeom.analyses.sula import sula_stats

    st = sula_stats(hm, hb)
    ce, de = axis_entropy_corr(proj_e, hm, sig_e) if proj_e is not None else (np.nan, False)
    cf, df_ = axis_entropy_corr(proj_f, hm, sig_f)
    return {"mae_bits": st["mae_bits"], "pearson_r": st["pearson_r"], "axis_corr_edited": ce,
            "axis_corr_final": cf, "degenerate_edited": de, "degenerate_final": df_,
            "pc1_corr_final": pearson(pc1_f, hm)[0] if pc1_f is not None and np.isfinite(pc1_f).all() else np.nan,
            "mean_h_model_bits": st["mean_h_model_bits"]}


#: the changes against the baseline, each with _base, delta_, delta__lo, delta__hi, delta__bc, delta__replicates columns
_DELTA_KEYS = ("mae_bits", "pearson_r", "axis_corr_edited", "axis_corr_final")
#: the columns of :func:`intervention_summary`, in order
SUMMARY_COLUMNS = (["model", "run", "layers", "axis", "edit", "shift_sigmas", "positions", "n", "probe_layer_edited",
                    "probe_layer_final", "mae_bits", "pearson_r", "axis_corr_edited", "axis_corr_final",
                    "degenerate_edited", "degenerate_final", "pc1_corr_final", "pc1_corr_final_lo", "pc1_corr_final_hi",
                    "pc1_corr_final_replicates", "mean_h_model_bits",
                    "final_layer_edited", "mean_abs_dh_model_bits", "mean_label_mass"]
                   + [f"{p}{k}{q}" for k in _DELTA_KEYS
                      for p, q in (("", "_base"), ("delta_", ""), ("delta_", "_lo"), ("delta_", "_hi"),
                                   ("delta_", "_bc"), ("delta_", "_replicates"))]
                   + ["n_boot", "ci", "seed"])


def _not_applicable(per_prompt, model, *, n_boot: int, ci: float, seed: int):
    """The summary of a model without attention layers: one row, :data:`SUMMARY_COLUMNS` NaN or empty (no run, no
    condition: the runs are named by attention layers) and ``not_applicable`` the reason."""
    import pandas as pd

    if model is None:
        raise ValueError("the intervention tables have no rows (a model without attention layers): pass model= to "
                         "name the summary's row")
    row = dict.fromkeys(SUMMARY_COLUMNS, np.nan)
    row.update(model=model, run="", layers="", axis="", edit="", positions="", n=0, n_boot=n_boot, ci=ci, seed=seed,
               not_applicable=per_prompt.attrs.get("not_applicable") or NO_ATTENTION_LAYERS)
    return pd.DataFrame([row])


def intervention_summary(per_prompt, axes, *, n_boot: int, ci: float, seed: int, model: str | None = None):
    """One row per condition: SULA MAE / r and the axis-entropy correlation after the edit, their changes
    against the unedited baseline, and paired basic (reverse-percentile) bootstrap CIs over prompts for the
    changes with the bias-corrected change they are centred on.

    Args:
        per_prompt, axes: the DataFrames of :func:`intervention_experiment` (or read back from CSV).
        n_boot: bootstrap resamples (the same resampled prompts for the condition and the baseline).
        model: the model the tables are of (the rule passes it); needed only for tables without rows, which name
            no model.

    Returns:
        DataFrame with model, run, layers, axis, edit, shift_sigmas, positions, n, probe_layer_edited (the
        last edited layer), probe_layer_final (the model's last layer), mae_bits, pearson_r,
        axis_corr_edited / axis_corr_final (Pearson corr(v.u_ent, H_model) at the probe layer after the
        edit; 0 and degenerate_* = True when the projection is (numerically) constant: after axis_cut at that
        layer it is 0 by construction, so no claim is decided on it), pc1_corr_final (Pearson corr of the PC1
        recomputed on the post-edit last-layer values with the post-edit H_model, >= 0 by its sign convention:
        what an edit leaves of the entropy geometry; NaN in tables without ``pc1_recomputed_L*``) with
        pc1_corr_final_lo / _hi (basic bootstrap over the same prompt resamples, clipped to [-1, 1]; the PC1 scores
        are those of the full-sample fit, not refitted per resample, so the interval is conditional on that axis) and
        pc1_corr_final_replicates,
        final_layer_edited (the last layer is among the edited ones), mean_h_model_bits,
        mean_abs_dh_model_bits (mean |H_model(edit) - H_model(baseline)| per prompt), mean_label_mass,
        baseline values (*_base), and delta_* = edited - baseline with delta_*_lo / _hi bounds (basic
        bootstrap, resampling prompts jointly for the edit and the baseline) and delta_*_bc = 2 delta -
        mean(replicates) (:func:`llmgeom.core.stats.bias_corrected`) and delta_*_replicates, the replicates the
        interval is taken from (:func:`llmgeom.core.stats.replicates_text`; replicate b of every column of a row,
        and of every row of a model, from the same prompt resample b). Columns: :data:`SUMMARY_COLUMNS`.

        A model without attention layers (the runner's tables have no rows and a ``not_applicable`` column,
        ``llmgeom.interventions.runner.not_applicable_outputs``): one row for ``model``, n = 0, no run / axis /
        edit, NaN measures, n_boot / ci / seed as given, and a ``not_applicable`` column with the reason
        (:data:`llmgeom.core.not_applicable.NO_ATTENTION_LAYERS`); the claims that read this table are "not testable
        here" for it with that reason (claims.yaml ``not_applicable``). Tables of attention models have no such
        column.

    Raises:
        ValueError: no baseline rows, n_boot < 1, or tables without rows and no ``model``.

    Source: Paper III sec. 4.5-4.6.
    """
    import pandas as pd

    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if "not_applicable" in per_prompt.columns and per_prompt.empty:  # a state-space model: nothing was edited
        return _not_applicable(per_prompt, model, n_boot=n_boot, ci=ci, seed=seed)
    base = per_prompt[per_prompt.condition == "baseline"].set_index("prompt")
    if base.empty:
        raise ValueError("no baseline rows in the intervention results")
    sig = dict(zip(axes.layer, axes.sigma))
    final = int(axes.layer.max())
    rng = np.random.default_rng(seed)
    n = len(base)
    boot_idx = rng.integers(0, n, size=(n_boot, n))
    rows = [_condition_summary(g.set_index("prompt").loc[base.index], base, sig, final, boot_idx, n=n, n_boot=n_boot,
                               ci=ci, seed=seed)
            for _cond, g in per_prompt.groupby("condition", sort=False)]
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _condition_summary(g, base, sig: dict, final: int, boot_idx, *, n: int, n_boot: int, ci: float, seed: int) -> dict:
    """One condition's row of :func:`intervention_summary`: its statistics, the baseline's, their change with the
    basic-bootstrap interval over the paired prompt resamples ``boot_idx`` [n_boot, n] and the bias-corrected
    change. ``g`` / ``base``: the condition's and the baseline's per-prompt rows, in the same prompt order."""
    # a column of single layers reads back from CSV as float ("1.0"); "1+2" stays a string
    layers = [int(float(x)) for x in str(g.layers.iloc[0]).split("+") if x not in ("", "nan")]
    le = layers[-1] if layers else None
    hb = base.h_bayes_bits.to_numpy(np.float64)
    hm, hm0 = g.h_model_bits.to_numpy(np.float64), base.h_model_bits.to_numpy(np.float64)
    pf, pf0 = g[f"proj_L{final}"].to_numpy(np.float64), base[f"proj_L{final}"].to_numpy(np.float64)
    pe = g[f"proj_L{le}"].to_numpy(np.float64) if le is not None else None
    pe0 = base[f"proj_L{le}"].to_numpy(np.float64) if le is not None else None
    args = (sig.get(le, np.nan), sig[final])
    rc = f"pc1_recomputed_L{final}"  # absent in tables written by older versions
    qf = g[rc].to_numpy(np.float64) if rc in g else None
    qf0 = base[rc].to_numpy(np.float64) if rc in base else None
    st = _cond_stats(hm, hb, pe, pf, *args, qf)
    st0 = _cond_stats(hm0, hb, pe0, pf0, *args, qf0)
    keys = _DELTA_KEYS
    boots = np.full((n_boot, len(keys)), np.nan)
    pc1_boot = np.full(n_boot, np.nan)  # pc1_corr_final of each resample (the full-sample PC1 scores resampled)
    for b in range(n_boot):
        ix = boot_idx[b]
        s1 = _cond_stats(hm[ix], hb[ix], pe[ix] if pe is not None else None, pf[ix], *args)
        s0 = _cond_stats(hm0[ix], hb[ix], pe0[ix] if pe0 is not None else None, pf0[ix], *args)
        boots[b] = [s1[k] - s0[k] for k in keys]
        if np.isfinite(st["pc1_corr_final"]):
            pc1_boot[b] = pearson(qf[ix], hm[ix])[0]
    row = dict(model=g.model.iloc[0], run=g.run.iloc[0], layers=str(g.layers.iloc[0]) if layers else "",
               axis=g.axis.iloc[0], edit=g.edit.iloc[0], shift_sigmas=float(g.shift_sigmas.iloc[0]),
               positions=g.positions.iloc[0], n=n, probe_layer_edited=le if le is not None else np.nan,
               probe_layer_final=final, **st,
               final_layer_edited=final in layers,
               mean_abs_dh_model_bits=float(np.mean(np.abs(hm - hm0))),
               mean_label_mass=float(g.label_mass.mean()))
    pc = st["pc1_corr_final"]
    row["pc1_corr_final_lo"], row["pc1_corr_final_hi"] = (bootstrap_interval(pc, pc1_boot, ci=ci, bounds=(-1.0, 1.0))
                                                          if np.isfinite(pc) else (np.nan, np.nan))
    row["pc1_corr_final_replicates"] = replicates_text(pc1_boot) if np.isfinite(pc) else ""
    for k in keys:
        row[f"{k}_base"] = st0[k]
        row[f"delta_{k}"] = st[k] - st0[k]
        col = boots[:, keys.index(k)]
        d = row[f"delta_{k}"]
        lo, hi = bootstrap_interval(d, col, ci=ci, method="basic") if np.isfinite(d) else (np.nan, np.nan)
        row[f"delta_{k}_lo"], row[f"delta_{k}_hi"] = lo, hi
        row[f"delta_{k}_bc"] = bias_corrected(d, col)
        row[f"delta_{k}_replicates"] = replicates_text(col)
    row.update(n_boot=n_boot, ci=ci, seed=seed)
    return row

