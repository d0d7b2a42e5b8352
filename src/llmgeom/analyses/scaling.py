"""scaling.csv: the per-model statistics of this run set against model size, beside each model's random-init twin
and the papers' own models. Tables in, tables out; never torch, and no statistic is recomputed here:
each value, and its interval, is read from the cross-model table that owns it (:data:`STATISTICS` names the table
and columns), the sizes from :func:`llmgeom.weights.model_size.parameter_counts`, the papers' values and their
models' sizes from ``llmgeom/data/published.yaml``.

The across-size claims (``claims.yaml``, table ``scaling``) are decided on this table by the slope rules of
:mod:`llmgeom.analyses.claims` (``size_trend``, ``size_constancy``), which read each model's interval (lo / hi).

May import: numpy, pandas (inside the functions), llmgeom.core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmgeom.core.published import (load_published, load_published_models, matching_entries, model_key,
                                    source_text, value_text)
from llmgeom.core.tables import LAST_TOKEN_ID, TOKEN_ID, TOKEN_ID_CROSS_PASSAGE

# numpy / pandas are imported inside the functions: the workflow reads STATISTICS when it builds the DAG
if TYPE_CHECKING:
    import pandas as pd

#: ``source`` of this run's trained models, their twins and the papers' models in scaling.csv
MEASURED, NULL, PUBLISHED = "measured", "null_model", "published"
#: columns of scaling.csv, in order (docs/outputs.md describes each)
COLUMNS = ["statistic", "label", "unit", "model", "source", "null_of", "n_params", "n_params_non_embedding", "d_model",
           "n_layers", "prompt_set", "value", "lo", "hi", "interval", "value_replicates", "reference", "reference_kind",
           "twin_model",
           "twin_value", "published", "published_on", "table", "column", "note"]


@dataclass(frozen=True)
class Statistic:
    """One statistic of the scaling table: where it is read and what it is set beside.

    Attributes:
        name: the ``statistic`` of scaling.csv. label, unit: how figures and tables name it.
        table: the cross-model table (results/summary/<table>.csv) that owns it; column, lo, hi: its value and
            interval columns (lo / hi None: the table has no interval). interval: what lo / hi are.
        where: row filter (column -> value or tuple of values) before one row per model is taken.
        prefer: (column, values): of a model's rows, the first value in that order (e.g. the MLE variant).
        pick: "max_layer" (the row of the largest layer) or "" (the only row left).
        reference, reference_kind: a column of the same row that holds its baseline (e.g. noise of the same n and d)
            and what that is.
        published: the quantity of published.yaml that holds the papers' per-model values.
        magnitude: report |value| (a correlation whose sign the paper drops, e.g. LSM's |rho(margin, entropy)|).
    """

    name: str
    label: str
    unit: str
    table: str
    column: str
    lo: str | None = None
    hi: str | None = None
    interval: str = ""
    where: dict = field(default_factory=dict)
    prefer: tuple = ()
    reference: str | None = None
    reference_kind: str = ""
    published: str | None = None
    magnitude: bool = False


_LLM = {"source": ("llm", "null_model")}
_BOOT = "95% basic bootstrap over prompts"
_PC = dict(unit="share of variance", table="table2", interval=_BOOT, where=_LLM)
#: the ID of each statistic is named by the id_profile ``quantity`` (llmgeom.core.tables): "token" statistics read
#: token_id (LSM's points), never the last-token ID (twonn_last_token_peak_id) nor the cross-passage variant
_TOKEN_ID = {"quantity": TOKEN_ID}


def _PASSAGE_CI(col: str) -> dict:  # noqa: N802 (a constant-like factory of Statistic fields)
    return dict(lo=f"{col}_lo", hi=f"{col}_hi", interval="basic interval over passage half-samples (coverage: "
                                                            "intrinsic_dimension.ci)")


_MLE = ("estimator", ("mle_lb", "mle_mg", "mle"))  # LSM's MLE is Levina-Bickel's: mle_lb first
_MAIN = {"condition": "main", "k": "all"}
_PASSAGES = "95% basic bootstrap over passages"

#: the statistics of scaling.csv, in the order of the table and the figures
STATISTICS = (
    Statistic("pc12_mixed", "PC1+PC2, mixed prompts (final-layer values)", column="pc12_mixed", lo="pc12_mixed_lo",
              hi="pc12_mixed_hi", reference="pc12_mixed_iso", reference_kind="isotropic noise, same n and d",
              published="paper3_table2_pc12_mixed", **_PC),
    Statistic("pc12_restricted", "PC1+PC2, restricted prompts (final-layer values)", column="pc12_restricted",
              lo="pc12_restricted_lo", hi="pc12_restricted_hi", reference="pc12_restricted_iso",
              reference_kind="isotropic noise, same n and d", published="paper3_table2_pc12_restricted", **_PC),
    Statistic("pc12_mixed_unit_norm", "PC1+PC2, mixed, each vector at unit norm", column="pc12_mixed_unit_norm",
              lo="pc12_mixed_unit_norm_lo", hi="pc12_mixed_unit_norm_hi", **_PC),
    Statistic("pc12_restricted_unit_norm", "PC1+PC2, restricted, each vector at unit norm",
              column="pc12_restricted_unit_norm", lo="pc12_restricted_unit_norm_lo", hi="pc12_restricted_unit_norm_hi",
              **_PC),
    Statistic("key_orthogonality", "key orthogonality (mean |cos| between W_K columns)", "mean |cos|", "table2",
              "orth_mean", interval="", where=_LLM, reference="gaussian_expected",
              reference_kind="Gaussian W_K of the same shape",
              published="key_orthogonality_trained"),
    Statistic("attention_focusing_pct", "attention focusing (entropy drop, first to last layer)", "percent", "table2",
              "focusing_pct", where=_LLM, published="paper3_table2_focusing_pct"),
    Statistic("twonn_token_peak_id", "TwoNN peak ID, token positions", "dimensions", "id_profile", "peak_id",
              where=dict(_TOKEN_ID, estimator="twonn"), published="lsm_table2_twonn_peak", **_PASSAGE_CI("peak_id")),
    Statistic("mle_token_peak_id", "MLE peak ID, token positions", "dimensions", "id_profile", "peak_id",
              where=_TOKEN_ID, prefer=_MLE, published="lsm_table2_mle_peak", **_PASSAGE_CI("peak_id")),
    Statistic("twonn_token_peak_relative_depth", "TwoNN ID peak, relative depth, token positions", "layer / L",
              "id_profile", "peak_relative_depth", where=dict(_TOKEN_ID, estimator="twonn"),
              published="lsm_peak_relative_depth", **_PASSAGE_CI("peak_relative_depth")),
    Statistic("mle_token_peak_relative_depth", "MLE ID peak, relative depth, token positions", "layer / L",
              "id_profile", "peak_relative_depth", where=_TOKEN_ID, prefer=_MLE, published="lsm_peak_relative_depth",
              **_PASSAGE_CI("peak_relative_depth")),
    Statistic("twonn_token_final_id", "TwoNN final-layer ID, token positions", "dimensions", "id_profile", "final_id",
              where=dict(_TOKEN_ID, estimator="twonn"), **_PASSAGE_CI("final_id")),
    Statistic("mle_token_final_id", "MLE final-layer ID, token positions", "dimensions", "id_profile", "final_id",
              where=_TOKEN_ID, prefer=_MLE, published="lsm_table2_mle_final", **_PASSAGE_CI("final_id")),
    Statistic("twonn_token_peak_id_over_d_model", "TwoNN peak ID / d_model, token positions", "fraction",
              "id_profile", "peak_id_over_d_model", where=dict(_TOKEN_ID, estimator="twonn"),
              reference="id_over_d_model_iso", reference_kind="isotropic noise, same n and d",
              published="lsm_table2_utilisation", **_PASSAGE_CI("peak_id_over_d_model")),
    Statistic("mle_token_peak_id_over_d_model", "MLE peak ID / d_model, token positions", "fraction", "id_profile",
              "peak_id_over_d_model", where=_TOKEN_ID, prefer=_MLE, **_PASSAGE_CI("peak_id_over_d_model")),
    Statistic("twonn_cross_passage_peak_id", "TwoNN peak ID, token positions, neighbours from other passages",
              "dimensions", "id_profile", "peak_id", where={"quantity": TOKEN_ID_CROSS_PASSAGE, "estimator": "twonn"},
              **_PASSAGE_CI("peak_id")),
    Statistic("twonn_last_token_peak_id", "TwoNN peak ID, last token of the prompts", "dimensions", "id_profile",
              "peak_id", where={"quantity": LAST_TOKEN_ID, "estimator": "twonn"}),
    Statistic("margin_median", "median Voronoi margin", "logits", "margins", "margin_q50", interval=_PASSAGES,
              published="lsm_table3_median_margin"),
    Statistic("margin_q05", "hard core m0.05 (5% margin quantile)", "logits", "margins", "margin_q05",
              interval=_PASSAGES,
              published="lsm_table4_margin_q05"),
    Statistic("margin_q25", "25% margin quantile", "logits", "margins", "margin_q25", interval=_PASSAGES,
              published="lsm_table4_margin_q25"),
    Statistic("margin_q75", "75% margin quantile", "logits", "margins", "margin_q75", interval=_PASSAGES,
              published="lsm_table4_margin_q75"),
    Statistic("margin_q95", "95% margin quantile", "logits", "margins", "margin_q95", interval=_PASSAGES,
              published="lsm_table4_margin_q95"),
    Statistic("p_margin_below", "Pr(margin < threshold)", "fraction", "margins", "p_margin_below", interval=_PASSAGES,
              published="lsm_table3_p_margin_below"),
    Statistic("abs_rho_margin_entropy", "|Spearman rho(margin, entropy)|", "dimensionless", "margins",
              "spearman_margin_entropy", magnitude=True, published="lsm_table3_abs_rho"),
    Statistic("eta_slope", "expressibility-gap slope beta", "dimensionless", "expressibility_gap", "beta",
              lo="beta_lo", hi="beta_hi", interval="95% percentile bootstrap over passages",
              published="lsm_table3_slope"),
    Statistic("eta_r2", "expressibility-gap fit R^2", "dimensionless", "expressibility_gap", "r2",
              interval="95% percentile bootstrap over passages",
              published="lsm_table3_r2"),
    Statistic("perplexity", "corpus perplexity", "perplexity (own tokenizer)", "margins",
              "perplexity", interval=_PASSAGES),
    Statistic("sula_entropy_mae", "SULA entropy MAE (all k)", "bits", "sula", "mae_bits", where=_MAIN,
              published="paper3_sula_entropy_mae"),
)
#: the tables scaling.csv reads
TABLES = tuple(dict.fromkeys(s.table for s in STATISTICS))


def _num(row, col) -> float:
    import pandas as pd

    if not col or col not in row:
        return float("nan")
    v = pd.to_numeric(pd.Series([row[col]]), errors="coerce").iloc[0]
    return float(v)


def _interval_columns(stat: Statistic, table) -> tuple:
    """(lo, hi, replicates) columns of ``stat`` in its owning table: the declared ones, else ``<column>_lo`` /
    ``_hi`` / ``_replicates`` where the table has them (None where it has not)."""
    from llmgeom.core.stats import REPLICATES_SUFFIX

    lo = stat.lo or (f"{stat.column}_lo" if f"{stat.column}_lo" in table else None)
    hi = stat.hi or (f"{stat.column}_hi" if f"{stat.column}_hi" in table else None)
    rep = stat.column + REPLICATES_SUFFIX
    return lo, hi, rep if rep in table else None


def _model_rows(stat: Statistic, table: pd.DataFrame | None, model: str) -> tuple[list[dict], str]:
    """The rows of ``stat`` for ``model`` (one per prompt set): value, lo, hi, reference, prompt_set; [] and why
    when there is none."""
    import numpy as np
    import pandas as pd

    from llmgeom.analyses.claims import filter_rows
    from llmgeom.core.stats import parse_replicates, replicates_text

    if table is None:
        return [], f"table {stat.table} not produced by this run"
    if stat.column not in table:
        return [], f"table {stat.table} has no column {stat.column}"
    g = filter_rows(table[table.model.astype(str) == model], stat.where)
    if stat.prefer and len(g):
        col, order = stat.prefer
        have = [v for v in order if v in set(g[col].astype(str))]
        g = g[g[col].astype(str) == have[0]] if have else g.iloc[0:0]
    if not len(g):
        return [], f"no row of {model} in {stat.table} matches {stat.where or 'the model'}"
    out = []
    for _, r in g.iterrows():
        note = f"{stat.prefer[0]} = {r[stat.prefer[0]]}" if stat.prefer else ""
        ps = r.get("prompt_set") if "prompt_set" in g else None
        v = _num(r, stat.column)
        lo_c, hi_c, rep_c = _interval_columns(stat, g)
        reps = r.get(rep_c, "") if rep_c else ""
        if stat.magnitude and rep_c:
            reps = replicates_text(np.abs(parse_replicates(reps)))
        out.append(dict(value=abs(v) if stat.magnitude else v, lo=_num(r, lo_c), hi=_num(r, hi_c),
                        value_replicates="" if pd.isna(reps) else str(reps),
                        reference=_num(r, stat.reference), prompt_set="" if pd.isna(ps) else str(ps or ""),
                        note=note))
    return out, ""


def _size_cells(sizes: pd.DataFrame, model: str) -> dict:
    s = sizes[sizes.model.astype(str) == model]
    keys = ("n_params", "n_params_non_embedding", "d_model", "n_layers")
    return {k: (float(s[k].iloc[0]) if len(s) and k in s else float("nan")) for k in keys}


def _published_cells(stat: Statistic, model: str) -> dict:
    es = matching_entries(stat.published, model) if stat.published else []
    return dict(published="; ".join(value_text(e) for e in es),
                published_on="; ".join(source_text(e) for e in es))


def _published_rows(stat: Statistic, base: dict) -> list[dict]:
    """The papers' models as rows: one per entry of ``stat.published`` that names a model (a range over several
    models is no point on a size axis); a range's centre as the value, its ends as lo / hi."""
    import numpy as np

    if not stat.published:
        return []
    facts = load_published_models()
    rows = []
    for e in load_published().get(stat.published, []):
        if not e["model"] or e["source_kind"] not in ("paper", "secondary"):
            continue
        f = facts.get(model_key(e["model"]), {})
        lo, hi = e.get("range", (float("nan"), float("nan")))
        v = e.get("value", (lo + hi) / 2 if "range" in e else float("nan"))
        rows.append(dict(base, model=e["model"], source=PUBLISHED, null_of="", n_params=f.get("n_params", np.nan),
                         n_params_non_embedding=float("nan"), d_model=f.get("d_model") or np.nan,
                         n_layers=f.get("n_layers") or np.nan, prompt_set=e["kind"], value=float(v), lo=lo, hi=hi,
                         interval="published range" if "range" in e else "", reference=float("nan"),
                         twin_model="", twin_value=float("nan"), published=value_text(e),
                         published_on=source_text(e),
                         note="" if f else f"no size of {e['model']} in published.yaml models"))
    return rows


def scaling_table(tables: dict, sizes: pd.DataFrame, *, models: list[str], nulls: dict | None = None) -> pd.DataFrame:
    """scaling.csv: every statistic of :data:`STATISTICS` for every model of this run, its twin and the papers'
    models, with the model's size.

    Args:
        tables: table name (:data:`TABLES`) -> the cross-model DataFrame (results/summary/<name>.csv), or None
            for a table the run did not produce (its statistics get NaN rows with the reason in ``note``).
        sizes: one row per model (trained and null) with model, n_params, n_params_non_embedding, d_model,
            n_layers (:func:`llmgeom.weights.model_size.parameter_counts`).
        models: the run's trained models; nulls: null model -> the trained model it is the twin of.

    Returns:
        DataFrame with :data:`COLUMNS`: per statistic, the trained models (source "measured", sorted by n_params),
        their twins (source "null_model", null_of = the trained model, the trained model's size) and the papers'
        models (source "published", their size from published.yaml's ``models``), one row per model and prompt set:
        value, lo / hi (the owning table's interval, ``interval`` says what it is; NaN where it has none),
        value_replicates (the owning table's ``<column>_replicates``: the resamples behind lo / hi, "" without),
        reference
        (the row's baseline column, ``reference_kind``), twin_model / twin_value (trained rows: the twin's value of
        the same prompt set), published / published_on (an entry published for this very model; "" otherwise), the
        table and column it was read from and a note (why a value is missing, which estimator).
    """
    import numpy as np
    import pandas as pd

    twin_of = {t: n for n, t in (nulls or {}).items()}
    order = sorted(models, key=lambda m: (_size_cells(sizes, m)["n_params"], m))
    order += [twin_of[m] for m in order if m in twin_of]
    rows = []
    for stat in STATISTICS:
        base = dict(statistic=stat.name, label=stat.label, unit=stat.unit, table=stat.table, column=stat.column,
                    interval=stat.interval, reference_kind=stat.reference_kind if stat.reference else "")
        got = {}
        for m in order:
            null_of = (nulls or {}).get(m, "")
            found, why = _model_rows(stat, tables.get(stat.table), m)
            size = _size_cells(sizes, m if m in set(sizes.model.astype(str)) else (null_of or m))
            for r in found or [dict(value=np.nan, lo=np.nan, hi=np.nan, value_replicates="", reference=np.nan,
                                    prompt_set="", note=why)]:
                got[(m, r["prompt_set"])] = r["value"]
                rows.append(dict(base, model=m, source=NULL if null_of else MEASURED, null_of=null_of, **size, **r,
                                 **_published_cells(stat, m)))
        for r in rows:
            if r["statistic"] == stat.name and r["source"] == MEASURED:
                t = twin_of.get(r["model"], "")
                r.update(twin_model=t, twin_value=got.get((t, r["prompt_set"]), np.nan) if t else np.nan)
        rows += _published_rows(stat, base)
    df = pd.DataFrame(rows)
    for c in COLUMNS:
        if c not in df:
            df[c] = ""
    for c in ("twin_model", "published", "published_on", "note", "null_of", "prompt_set", "reference_kind",
              "value_replicates"):
        df[c] = df[c].fillna("")
    return df[COLUMNS]
