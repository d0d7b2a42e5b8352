"""table1.csv / table2.csv: the Paper III Table-1 and Table-2 analogues across models, and their
Markdown / HTML renderings for the report. Tables in, tables out; never torch.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from llmgeom.core.published import add_published, deciding_kinds, entries_by_kind, published_text
from llmgeom.core.stats import REPLICATES_SUFFIX, parse_replicates, replicates_text

#: measured column -> quantity looked up in llmgeom/data/published.yaml (absent quantity: empty cell)
TABLE1_PUBLISHED = {"pc1": "paper3_table1_pc1", "pc12": "paper3_table1_pc12",
                    "participation_ratio_top10": "paper3_table1_participation_ratio_top10",
                    "spearman_rho": "paper3_rho_pc1_entropy"}
TABLE2_PUBLISHED = {"pc12_mixed": "paper3_table2_pc12_mixed", "pc12_restricted": "paper3_table2_pc12_restricted",
                    "orth_mean": "key_orthogonality_trained", "gaussian_expected": "key_orthogonality_gaussian",
                    "random_init_mean": "key_orthogonality_random_init", "focusing_pct": "paper3_table2_focusing_pct",
                    "pc1_wind_tunnel": "paper3_table2_pc1"}

BC_NOTE = ("Each share is shown as 'estimate (bias-corrected) [95% basic-bootstrap CI]': with n = 75 prompts < d "
           "features the sample share is biased upward, the bootstrap estimates that bias, and the basic "
           "(reverse-percentile) interval is centred on the bias-corrected value 2 x estimate - mean(replicates), "
           "so the raw estimate may lie above its interval.")
DEPTH_NOTE = ("Relative depth = (layer + 1) / L for block outputs (the final layer is 1.0); residual-stream "
              "layer h (0 = embeddings) is at h / L.")
def random_init_note(df: pd.DataFrame | None = None) -> str:
    """Legend line of Table 2 on the random-init key-orthogonality baseline, with no number typed in: the published
    value from ``llmgeom/data/published.yaml`` (quantity ``key_orthogonality_random_init``) and this run's values
    from the table's own columns.

    Args:
        df: the Table 2 DataFrame (:func:`table2`) or None (then only the published value and the columns to read).

    Returns:
        str: the published baseline; the Gaussian expectation sqrt(2 / (pi d_model)) (``gaussian_expected``) and,
        per model of this run that has them, orth_mean against random_init_mean and gaussian_expected (3
        decimals); whether any random-init architecture of this run reaches the published range.
    """

    pub = published_text("key_orthogonality_random_init")
    out = (f"Published random-init key-orthogonality baseline (Paper III): {pub or 'none in the data file'}. For a "
           "randomly initialized W_K the mean |cos| between columns is about sqrt(2 / (pi d_model)) (column "
           "gaussian_expected); random_init_mean is the same statistic on the model's architecture at random init, "
           "orth_mean on the trained keys.")
    if df is None or not len(df):
        return out
    need = ["model", "orth_mean", "random_init_mean", "gaussian_expected"]
    if not set(need) <= set(df.columns):
        return out
    d = df[df["source"] != "published"] if "source" in df else df
    if "null_of" in d:  # trained rows only (a twin's orth_mean is itself a random-init value)
        d = d[d["null_of"].fillna("").astype(str) == ""]
    d = d.dropna(subset=["orth_mean", "random_init_mean"])
    if not len(d):
        return out
    cells = "; ".join(f"{r.model} {r.orth_mean:.3f} vs {r.random_init_mean:.3f}"
                      + (f" (Gaussian {r.gaussian_expected:.3f})" if np.isfinite(r.gaussian_expected) else "")
                      for r in d.itertuples())
    out += f" This run, trained vs random init: {cells}."
    q = "key_orthogonality_random_init"
    lows = [e["range"][0] if "range" in e else e.get("value", e.get("min"))
            for k, es in entries_by_kind(q).items() if k in deciding_kinds(q) for e in es]
    lows = [float(v) for v in lows if v is not None]
    if lows:
        reach = bool((d.random_init_mean >= min(lows)).any())
        out += (" Some random-init architecture of this run reaches the published baseline." if reach else
                " No random-init architecture of this run reaches the published baseline.")
    return out


# ---------------------------------------------------------------------------------------------
# config helpers (called at DAG construction: must stay cheap and never touch a model or the hub)
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# cross-model summaries (Table 1 / Table 2 analogues)
# ---------------------------------------------------------------------------------------------

def _final_values(dr: pd.DataFrame, representation="values", standardized=True) -> pd.DataFrame:
    d = dr[(dr.representation == representation) & (dr.standardized.astype(str) == str(bool(standardized)))]
    return d[d.layer == d.groupby("model").layer.transform("max")]


def table1(dr: pd.DataFrame, *, representation: str = "values", standardized: bool = True,
           nulls: dict | None = None) -> pd.DataFrame:
    """Table-1 analogue (Paper III): PC1 and PC1+PC2 with 95% CIs at the final layer, per model and set.

    Args:
        dr: concatenated ``domain_restriction`` stats tables (all models).
        nulls: null model -> the trained model it is the null of; their rows get ``null_of``.

    Returns:
        one row per (model, prompt_set), mixed first: model, prompt_set, domain, role, n, layer, relative_depth
        ((layer+1)/L = 1.0), representation, standardized, pc1, pc1_bc (bias-corrected, 2 t - mean of the
        replicates), pc1_lo, pc1_hi (basic bootstrap), pc12, pc12_bc, pc12_lo, pc12_hi, participation_ratio (full
        spectrum), participation_ratio_top10 (10 largest eigenvalues), spearman_rho, spearman_p, delta_pc12,
        delta_pc12_bc, delta_pc12_lo, delta_pc12_hi (fractions of variance), the isotropic (parallel-analysis)
        and shuffled references at the same n and d pc1_iso, pc12_iso, pc12_shuffled (NaN where not computed),
        pc1_replicates, pc12_replicates, delta_pc12_replicates (the bootstrap replicates behind the intervals, as in
        ``dr``; "" or NaN where ``dr`` has none),
        null_of (the trained model a null row is the random-init twin of; "" otherwise), source ("measured"), and beside
        pc1, pc12, participation_ratio_top10 and spearman_rho the value published for the same model and
        prompt-set kind (``*_published``, "" where none) and its source (``*_published_on``); then the
        published models as rows of their own (source = "published", model = the paper's model, role = mixed /
        restricted, the published number in the same column and unit, ``secondary``), from
        ``llmgeom/data/published.yaml`` (:func:`llmgeom.core.published.add_published`).
    """
    d = _final_values(dr, representation, standardized).copy()
    d["_o"] = (d.role != "mixed").astype(int)
    d = d.sort_values(["model", "_o", "prompt_set"])
    cols = ["model", "prompt_set", "domain", "role", "n", "layer", "relative_depth", "representation", "standardized",
            "pc1", "pc1_bc", "pc1_lo", "pc1_hi", "pc12", "pc12_bc", "pc12_lo", "pc12_hi", "participation_ratio",
            "participation_ratio_top10", "spearman_rho", "spearman_p", "delta_pc12", "delta_pc12_bc", "delta_pc12_lo",
            "delta_pc12_hi", "pc1_iso", "pc12_iso", "pc12_shuffled", "pc1_replicates", "pc12_replicates",
            "delta_pc12_replicates"]
    d = d[[c for c in cols if c in d.columns]].reset_index(drop=True)
    d["null_of"] = [dict(nulls or {}).get(m, "") for m in d.model]
    return add_published(d, TABLE1_PUBLISHED,
                         kind_col="role", rows=True, also=("official_code",))


def _attention_label(att: str, n_sliding: int, n_layers: int, window) -> str:
    if n_sliding and window:
        part = "all layers" if n_sliding == n_layers else f"{n_sliding}/{n_layers} layers"
        return f"{att} + sliding window ({int(window)} tokens, {part})"
    return att


def table2(dr: pd.DataFrame, ko: pd.DataFrame, af: pd.DataFrame, *, restricted_set: str,
           representation: str = "values", standardized: bool = True, wt: pd.DataFrame | None = None,
           wt_geometry: pd.DataFrame | None = None, nulls: dict | None = None) -> pd.DataFrame:
    """Table-2 analogue (Paper III): per model, value manifold mixed vs restricted, key orthogonality
    range vs baselines, attention focusing and attention type.

    Args:
        dr: concatenated domain_restriction stats; ko: concatenated key_orthogonality tables;
        af: concatenated attention_focusing_summary tables; restricted_set: prompt set of the
            "restricted" column (e.g. domain_mathematics).
        nulls: null model -> the trained model it is the null of: their rows have source "null_model"
            (NULL_SOURCE; not "null", which CSV readers take for a missing value) and ``null_of``; a wind-tunnel
            null (step 0) needs its rows in ``wt`` too.

    Returns:
        one row per model: model, attention_type (MHA / GQA / MQA, "+ sliding window (...)" when some
        layers use one), n_layers, restricted_set, restricted_domain, pc12_mixed (+ _bc/_lo/_hi), pc12_restricted
        (+ _bc/_lo/_hi), pc12_mixed_unit_norm / pc12_restricted_unit_norm (+ _lo/_hi: the same shares after every
        value vector is scaled to unit norm), delta_pc12 (+ _bc/_lo/_hi) at the final layer, and the bootstrap
        replicates behind those intervals, pc12_mixed_replicates, pc12_restricted_replicates,
        pc12_mixed_unit_norm_replicates, pc12_restricted_unit_norm_replicates, delta_pc12_replicates
        (:func:`llmgeom.core.stats.replicates_text`, from ``dr``; "" where it has none; delta replicate b =
        restricted b - mixed b; the isotropic / shuffled references are means over noise draws, no interval and no
        replicates); attention focusing (``af``) adds focusing_pct_lo / _hi / _replicates and
        focusing_rho_replicates where its table has them; orth_min, orth_max, orth_mean (per-layer mean
        over key heads: range over layers), gaussian_min/max, gaussian_expected (sqrt(2/(pi d_model))),
        random_init_min/max/mean (same statistic, same shapes), orth_over_random_init (orth_mean / mean
        random-init baseline), orth_not_applicable (why key orthogonality does not apply to the model, e.g.
        multi-head latent attention: its orth_* cells are NaN; "" otherwise); focusing_pct,
        focusing_pct_global, focusing_rho, focusing_p. Orthogonality values
        dimensionless in [0, 1]. Beside pc12_mixed, pc12_restricted, orth_mean, random_init_mean and
        focusing_pct: ``*_published`` / ``*_published_on``, the value published for the same model ("" where
        none); then the published models as rows of their own (``source`` = "published": Paper III's Table 2
        models, its wind-tunnel row and its random-init / Gaussian baselines), the published number in the same
        column and unit (``llmgeom/data/published.yaml``, :func:`llmgeom.core.published.add_published`).

        Wind-tunnel models (``wt``: concatenated ``wind_tunnel`` tables, ``wt_geometry``:
        ``wind_tunnel_geometry`` tables, both of :mod:`llmgeom.analyses.wind_tunnel`) are rows beside the LLMs
        (after them): ``source`` = "wind_tunnel" (LLMs: "llm"), ``task``, ``step``, ``entropy_mae_bits`` and
        ``entropy_pearson_r`` (model entropy over the answer symbols vs the exact posterior entropy, all
        prompts), ``pc1_wind_tunnel`` / ``pc12_wind_tunnel`` (PC1 / PC1+PC2 of the standardized final-layer
        values on the wind-tunnel prompts), and per representation (values, attn_output, residual_stream) the largest |Spearman
        rho(PC1, exact entropy)| over layers, ``abs_rho_pc1_h_exact_<representation>``; the LLM-only columns
        (pc12_mixed / restricted, restricted_set) are empty for them, and theirs for the LLMs. Only the
        models of ``wt`` count as wind-tunnel models (checkpoints left out of ``wt`` are not rows).
    """
    fin = _final_values(dr, representation, standardized)
    kcols = [c for c in ("orthogonality", "baseline_gaussian", "baseline_random_init", "gaussian_expected")
             if c in ko.columns]
    kl = ko.groupby(["model", "layer"], as_index=False)[kcols].mean()
    na = ko.not_applicable if "not_applicable" in ko.columns else pd.Series([], dtype=object)
    orth_na = {m: x.strip() for m, x in zip(ko.model, na) if isinstance(x, str) and x.strip()}  # no W_K: why
    wt_models = list(dict.fromkeys(wt.model)) if wt is not None and len(wt) else []
    llms = sorted((set(fin.model) | set(kl.model) | set(af.model)) - set(wt_models))
    rows = []
    for m in llms + wt_models:
        nulls = dict(nulls or {})
        r = dict(model=m, source=NULL_SOURCE if m in nulls else "wind_tunnel" if m in wt_models else "llm",
                 null_of=nulls.get(m, ""))
        a = af[af.model == m]
        if len(a):
            a = a.iloc[0]
            r.update(attention_type=_attention_label(a.attention_type, int(a.n_sliding_layers), int(a.n_layers),
                                                     a.sliding_window if pd.notna(a.sliding_window) else None),
                     n_layers=int(a.n_layers))
        ko_af = dict(_ko_af_columns(kl[kl.model == m], a), orth_not_applicable=orth_na.get(m, ""))
        if m in wt_models:
            r.update(ko_af, **_wind_tunnel_columns(m, wt, wt_geometry))
            rows.append(r)
            continue
        f = fin[fin.model == m]
        mx = f[f.role == "mixed"]
        rs = f[f.prompt_set == restricted_set]
        r["restricted_set"] = restricted_set
        r["restricted_domain"] = rs.domain.iloc[0] if len(rs) else None
        for tag, g in (("mixed", mx), ("restricted", rs)):
            for k in ("pc12", "pc12_bc", "pc12_lo", "pc12_hi", "pc12_iso", "pc12_shuffled", "pc12_unit_norm",
                      "pc12_unit_norm_lo", "pc12_unit_norm_hi"):
                ok = len(g) and k in g
                r[f"{k.replace('pc12', 'pc12_' + tag)}"] = float(g[k].iloc[0]) if ok else float("nan")
            for k in ("pc12", "pc12_unit_norm"):
                r[f"{k.replace('pc12', 'pc12_' + tag)}{REPLICATES_SUFFIX}"] = _cell(g, k + REPLICATES_SUFFIX)
        for k in ("delta_pc12", "delta_pc12_bc", "delta_pc12_lo", "delta_pc12_hi"):
            r[k] = float(rs[k].iloc[0]) if len(rs) and k in rs else float("nan")
        r["delta_pc12" + REPLICATES_SUFFIX] = _cell(rs, "delta_pc12" + REPLICATES_SUFFIX)
        r["delta_pc12_iso"] = r["pc12_restricted_iso"] - r["pc12_mixed_iso"]  # the noise reference of delta_pc12
        r.update(ko_af)
        rows.append(r)
    return add_published(pd.DataFrame(rows), TABLE2_PUBLISHED, rows=True, also=("official_code",))


_WT_REPRESENTATIONS = ("values", "attn_output", "residual_stream")


def _cell(g: pd.DataFrame, col: str) -> str:
    """The ``<column>_replicates`` cell of the first row of ``g`` ("" when there is none: no row, no column, or
    an empty cell read back from CSV as NaN; a single replicate that CSV read back as a number is text again)."""
    return replicates_text(parse_replicates(g[col].iloc[0])) if len(g) and col in g else ""


def _wind_tunnel_columns(m: str, wt: pd.DataFrame, geo: pd.DataFrame | None) -> dict:
    """Table-2 cells of a wind-tunnel model: task, step, calibration over all prompts, PC1+PC2 of the final-layer
    values and the best |rho(PC1, exact entropy)| over layers per representation (NaN where not measured)."""
    out = {}
    s = wt[(wt.model == m) & (wt.t.astype(str) == "all")]
    if len(s):
        s = s.iloc[0]
        out.update(task=s.task, step=s.step, entropy_mae_bits=float(s.mae_bits), entropy_pearson_r=float(s.pearson_r))
    out["pc1_wind_tunnel"] = out["pc12_wind_tunnel"] = float("nan")
    for rep in _WT_REPRESENTATIONS:
        out[f"abs_rho_pc1_h_exact_{rep}"] = float("nan")
    if geo is not None and len(geo):
        g = geo[geo.model == m]
        v = g[g.representation == "values"]
        if len(v):
            last = v[v.layer == v.layer.max()]
            out["pc12_wind_tunnel"] = float(last.pc12.iloc[0])
            if "pc1" in last:
                out["pc1_wind_tunnel"] = float(last.pc1.iloc[0])
            for c in ("pc1", "pc12"):  # the bootstrap over prompts of the final layer's shares, where it has one
                for sfx in ("_lo", "_hi", REPLICATES_SUFFIX):
                    if c + sfx in last:
                        x = last[c + sfx].iloc[0]
                        out[f"{c}_wind_tunnel{sfx}"] = ("" if sfx == REPLICATES_SUFFIX and not isinstance(x, str)
                                                      else x)
        for rep in _WT_REPRESENTATIONS:
            x = g[g.representation == rep].abs_rho_pc1_h_exact
            if x.notna().any():
                out[f"abs_rho_pc1_h_exact_{rep}"] = float(x.max())
    return out


def _ko_af_columns(k: pd.DataFrame, a) -> dict:
    """Key-orthogonality (per-layer means ``k`` of one model) and attention-focusing (summary row ``a`` or an empty
    frame) cells of Table 2."""
    r = {}
    if len(k):
        r.update(orth_min=k.orthogonality.min(), orth_max=k.orthogonality.max(), orth_mean=k.orthogonality.mean(),
                 gaussian_min=k.baseline_gaussian.min(), gaussian_max=k.baseline_gaussian.max(),
                 gaussian_expected=(float(k.gaussian_expected.mean()) if "gaussian_expected" in k
                                    else float("nan")),
                 random_init_min=k.baseline_random_init.min(), random_init_max=k.baseline_random_init.max(),
                 random_init_mean=k.baseline_random_init.mean(),
                 orth_over_random_init=k.orthogonality.mean() / k.baseline_random_init.mean())
    if len(a):
        r.update(focusing_pct=float(a.focusing_pct), focusing_pct_global=float(a.focusing_pct_global),
                 focusing_rho=float(a.spearman_rho), focusing_p=float(a.spearman_p))
        for k, src in (("focusing_pct_lo", "focusing_pct_lo"), ("focusing_pct_hi", "focusing_pct_hi")):
            if src in a:
                r[k] = float(a[src])
        for k, src in (("focusing_pct", "focusing_pct"), ("focusing_rho", "spearman_rho")):
            if src + REPLICATES_SUFFIX in a:
                r[k + REPLICATES_SUFFIX] = replicates_text(parse_replicates(a[src + REPLICATES_SUFFIX]))
    return r


WIND_TUNNEL_NOTE = ("Wind-tunnel rows: small transformers trained on a task with an exact posterior; "
                    "entropy MAE = mean |H_model - H_exact| in bits over held-out prompts (H_model over the answer "
                    "symbols), max |rho| = largest |Spearman rho(PC1, H_exact)| over layers per representation "
                    "(n/a: not in the activation file); their value manifold is measured on the task's prompts, so "
                    "the mixed / restricted columns do not apply.")


def _wind_tunnel_cells(r) -> list[str]:
    """Markdown cells of the wind-tunnel columns of Table 2 ('-' for LLM rows; the published PC1 for a
    published row)."""
    src = getattr(r, "source", "llm")
    if src == "published":
        return [_pub_cell(r, "pc1_wind_tunnel", pct=True), "-", "-"]
    if src != "wind_tunnel" and not np.isfinite(float(getattr(r, "pc1_wind_tunnel", float("nan")))):
        return ["-", "-", "-"]
    f = lambda v: "n/a" if v is None or not np.isfinite(v) else f"{v:.2f}"  # noqa: E731
    rho = " / ".join(f(getattr(r, f"abs_rho_pc1_h_exact_{rep}", float("nan"))) for rep in _WT_REPRESENTATIONS)
    mae = getattr(r, "entropy_mae_bits", float("nan"))
    return [_pct(getattr(r, "pc1_wind_tunnel", float("nan"))), "n/a" if not np.isfinite(mae) else f"{mae:.4f}", rho]


def _pct(v, lo=None, hi=None, bc=None) -> str:
    """'estimate (bias-corrected) [lo, hi]' in percent (one decimal); parts that are missing are left out."""
    if v is None or not np.isfinite(v):
        return "n/a"
    s = f"{100 * v:.1f}"
    if bc is not None and np.isfinite(bc):
        s += f" ({100 * bc:.1f})"
    if lo is not None and hi is not None and np.isfinite(lo) and np.isfinite(hi):
        s += f" [{100 * lo:.1f}, {100 * hi:.1f}]"
    return s


def _pub_cell(r, col: str, pct: bool = False) -> str:
    """Markdown cell of a published row: the published text of ``col`` ('-' where the paper gives none), shares
    turned into percent like our cells when ``pct``."""
    txt = getattr(r, f"{col}_published", "")
    if not isinstance(txt, str) or not txt:
        return "-"
    if pct:
        txt = re.sub(r"\d+(?:\.\d+)?(?:e-?\d+)?", lambda m: f"{100 * float(m.group()):.3g}", txt)
    return txt


#: ``source`` of a null model's Table-2 row. Not "null": pandas.read_csv reads that as NaN.
NULL_SOURCE = "null_model"


def _pub_source(r) -> str:
    """Source cell of a published row: "published (paper)", "published (official code)", ..."""
    k = getattr(r, "source_kind", "")
    return "published (" + (str(k).replace("_", " ") if isinstance(k, str) and k else "paper") + ")"


def _run_source(r) -> str:
    """Source cell of one of this run's rows: "this run", or "null: random-init twin of <model>"."""
    n = getattr(r, "null_of", "")
    return f"null: random-init twin of {n}" if isinstance(n, str) and n else "this run"


NULL_NOTE = ("Null rows (Source = null: random-init twin of ...; source column null_model): each model's seeded random-init twin (same config, tokenizer and prompts; "
             "wind-tunnel models: the step-0 checkpoint), run through the same analyses. Isotropic reference: the mean "
             "share of i.i.d. Gaussian data at the same n and d (Horn's parallel analysis); shuffled: every coordinate "
             "permuted across prompts. A share is structure only as far as it rises above them.")


def _is_pub(r) -> bool:
    return getattr(r, "source", "") == "published"


def _pub_sources(df: pd.DataFrame) -> str:
    """Legend line: the sources of the published rows (once per source)."""
    if "published_source" not in df or "source" not in df:
        return ""
    srcs = sorted({x for v in df.loc[df.source == "published", "published_source"] if isinstance(v, str)
                   for x in v.split(" | ") if x})
    return ("Published rows (source = published, in the same columns and units): " + "; ".join(srcs) + "."
            if srcs else "")


def to_markdown(df: pd.DataFrame, kind: str) -> str:
    """Markdown rendering of :func:`table1` (``kind="table1"``) or :func:`table2` (``kind="table2"``):
    shares in percent as 'estimate (bias-corrected) [95% CI]'; the published models as rows of their own
    (Source = published, the paper's number in the same column and unit, '-' where the paper gives none), after
    ours; and a legend (a GitHub-flavoured pipe table plus legend lines)."""
    g0 = lambda r, k: getattr(r, k, float("nan"))  # noqa: E731
    if kind == "table1":
        head = ["Model", "Source", "Prompt set", "n", "PC1 % (bc) [95% CI]", "PC1+PC2 % (bc) [95% CI]", "PR (full)",
                "PR (top 10)", "rho(PC1, H)", "Δ PC1+PC2 vs mixed (pp) (bc) [95% CI]",
                "PC1+PC2 % isotropic / shuffled (same n, d)"]
        body = []
        for r in df.itertuples():
            if _is_pub(r):
                body.append([r.model, _pub_source(r), str(r.role), "-", _pub_cell(r, "pc1", True),
                             _pub_cell(r, "pc12", True), "-", _pub_cell(r, "participation_ratio_top10"),
                             _pub_cell(r, "spearman_rho"), "-", "-"])
                continue
            body.append([r.model, _run_source(r), r.domain if r.role == "restricted" else "mixed", str(int(r.n)),
                         _pct(r.pc1, r.pc1_lo, r.pc1_hi, g0(r, "pc1_bc")),
                         _pct(r.pc12, r.pc12_lo, r.pc12_hi, g0(r, "pc12_bc")),
                         f"{r.participation_ratio:.2f}", f"{g0(r, 'participation_ratio_top10'):.2f}",
                         f"{r.spearman_rho:.2f} (p={r.spearman_p:.2g})",
                         "-" if r.role == "mixed" else _pct(r.delta_pc12, r.delta_pc12_lo, r.delta_pc12_hi,
                                                            g0(r, "delta_pc12_bc")),
                         f"{_pct(g0(r, 'pc12_iso'))} / {_pct(g0(r, 'pc12_shuffled'))}"])
        legend = ("Table 1 analogue (Paper III): standardized last-token value vectors at the final layer "
                  "(relative depth 1.0), entropy-stratified selections; PC1 sign fixed so that rho >= 0 (Paper III's "
                  "sign is arbitrary: compare |rho|); Δ = restricted - mixed in percentage points (CI from independent "
                  "bootstraps). " + BC_NOTE + " PR: participation ratio over the full spectrum and over the 10 largest "
                  "eigenvalues (the published code's definition). Published rows: Paper III's models with its "
                  "prompt-set kind (restricted = its mathematics prompts), from llmgeom/data/published.yaml; '-' = not "
                  "published. " + _pub_sources(df) + " " + NULL_NOTE + " " + DEPTH_NOTE)
    elif kind == "table2":
        head = ["Model", "Source", "Attention", "PC1+PC2 mixed % (bc) [95% CI]", "PC1+PC2 restricted % (bc) [95% CI]",
                "Key orthogonality (range over layers)", "Gaussian baseline", "Random-init baseline", "Focusing %",
                "rho(H, depth)", "PC1 % (wind tunnel)", "Entropy MAE (bits)",
                "max |rho(PC1, H_exact)| values / attn output / residual",
                "PC1+PC2 % isotropic ref mixed / restricted (same n, d)"]
        body = []
        for r in df.itertuples():
            g = lambda k: g0(r, k)  # noqa: E731
            if _is_pub(r):
                body.append([r.model, _pub_source(r), "-", _pub_cell(r, "pc12_mixed", True),
                             _pub_cell(r, "pc12_restricted", True), _pub_cell(r, "orth_mean"),
                             _pub_cell(r, "gaussian_expected"), _pub_cell(r, "random_init_mean"),
                             _pub_cell(r, "focusing_pct"), "-", *_wind_tunnel_cells(r), "-"])
                continue
            body.append([r.model, _run_source(r), str(g("attention_type")),
                         _pct(g("pc12_mixed"), g("pc12_mixed_lo"), g("pc12_mixed_hi"), g("pc12_mixed_bc")),
                         f"{_pct(g('pc12_restricted'), g('pc12_restricted_lo'), g('pc12_restricted_hi'), g('pc12_restricted_bc'))} "
                         f"({g('restricted_domain')})",
                         f"{g('orth_min'):.3f}–{g('orth_max'):.3f}",
                         f"{g('gaussian_min'):.3f}–{g('gaussian_max'):.3f}",
                         f"{g('random_init_min'):.3f}–{g('random_init_max'):.3f}",
                         f"{g('focusing_pct'):.1f}", f"{g('focusing_rho'):.2f}", *_wind_tunnel_cells(r),
                         f"{_pct(g('pc12_mixed_iso'))} / {_pct(g('pc12_restricted_iso'))}"])
        legend = ("Table 2 analogue (Paper III): PC1+PC2 of standardized final-layer value vectors (mixed vs "
                  "restricted selection); key orthogonality = mean |cos| between W_K columns, per-layer mean over "
                  "key heads, range over layers, vs a Gaussian matrix and the random-init architecture of the same "
                  "shape; focusing = % reduction of the mean final-query attention entropy from the first to the last "
                  "layer; rho = Spearman of entropy vs layer index. " + BC_NOTE + " Published rows: Paper III's "
                  "Table 2 models, its wind-tunnel row and its baselines (sec. 4.2 / 4.5), in the same columns and "
                  "units (key orthogonality: the paper's early layers), from llmgeom/data/published.yaml; '-' = not "
                  "published. " + _pub_sources(df) + " " + random_init_note(df) + " " + WIND_TUNNEL_NOTE + " " + NULL_NOTE)
    else:
        raise ValueError(f"kind must be table1 or table2, got {kind!r}")
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in body]
    return "\n".join(lines) + "\n\n" + legend + "\n"


def markdown_tables_html(sections: dict) -> str:
    """A standalone HTML page with the pipe tables of :func:`to_markdown` outputs
    (``{"Table 1 analogue": md1, ...}``), each followed by its legend (for the Snakemake report)."""
    import html

    style = ("<style>body{font-family:sans-serif;font-size:13px} table{border-collapse:collapse} "
             "td,th{border:1px solid #bbb;padding:3px 6px}</style>")
    parts = []
    for title, md in sections.items():
        lines = [ln for ln in md.splitlines() if ln.startswith("|")]
        legend = " ".join(ln for ln in md.splitlines() if ln and not ln.startswith("|"))
        rows = [[html.escape(c.strip().replace("\\|", "|")) for c in ln.strip().strip("|").split(" | ")]
                for ln in lines]
        head = "".join(f"<th>{c}</th>" for c in rows[0]) if rows else ""
        body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows[2:])
        parts.append(f"<h3>{html.escape(title)}</h3><table><tr>{head}</tr>{body}</table><p>{html.escape(legend)}</p>")
    return f"<html><head><meta charset='utf-8'>{style}</head><body>{''.join(parts)}</body></html>\n"
