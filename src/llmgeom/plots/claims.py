"""The answer on one screen: the claims x models verdict matrix, one forest plot per numeric
claim, and the front page ``results/index.html`` that shows both with the headline counts.

Drawn from the scorecard (``results/summary/claims.csv``, :func:`llmgeom.analyses.claims.claims_table`) and, where
the study has a headline reference, from ``results/summary/drift.csv`` (:func:`llmgeom.analyses.drift.drift_table`).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np
import pandas as pd

from llmgeom.plots.base import panel_grid, plt, save_figure, shared_legend

#: cell colour per verdict; a supported verdict that its null shares is drawn pale and hatched
VERDICT_COLORS = {"specific finding": "#1a9850", "specific, unstable": "#91cf60", "supported, not specific": "#b8e0b0",
                  "not supported": "#d73027", "inconclusive": "#fdae61", "not testable here": "#d9d9d9"}


def _is_true(v) -> bool:
    return str(v) == "True"


def _stability(row) -> float:
    from llmgeom.analyses.claims import row_stability

    return row_stability(row)


def is_unstable(row) -> bool:
    """A decided verdict re-decided the same on fewer than :data:`llmgeom.analyses.claims.STABLE` of its resamples
    (a NaN stability, not re-decided, is not called unstable here: its category says so)."""
    from llmgeom.analyses.claims import STABLE

    st = _stability(row)
    return row["verdict"] in ("supported", "not supported") and np.isfinite(st) and st < STABLE


def cell_category(row) -> str:
    """Headline category of one scorecard row (:data:`llmgeom.analyses.claims.HEADLINE`): "specific finding"
    (specific and stable), "specific, unstable" (specific, but stability below STABLE or not re-decided),
    "supported, not specific" / the verdict."""
    from llmgeom.analyses.claims import STABLE

    if row["verdict"] == "supported":
        if not _is_true(row["specific"]):
            return "supported, not specific"
        return "specific finding" if _stability(row) >= STABLE else "specific, unstable"
    return row["verdict"]


def _model_label(m: str) -> str:
    return "all models" if str(m).startswith("all models") else str(m)


def verdict_matrix(card: pd.DataFrame, paths) -> None:
    """Claims x models matrix: one cell per claim and model, split into one stripe per setting (prompt set, run,
    ...), coloured by :data:`VERDICT_COLORS`; a stripe whose null (random-init twin or data-level null) gives the
    same verdict carries '=' (not specific).

    Args:
        card: the scorecard (claims.csv). paths: output files (PNG, PDF).
    """
    claims = list(dict.fromkeys(card.claim_id))
    models = list(dict.fromkeys(_model_label(m) for m in card.model))
    models = [m for m in models if m != "(any)"] + (["(any)"] if "(any)" in models else [])  # "(any)": no table
    fig, ax = plt.subplots(figsize=(2.0 + 1.5 * len(models), 0.9 + 0.28 * len(claims)))
    for i, c in enumerate(claims):
        for j, m in enumerate(models):
            g = card[(card.claim_id == c) & (card.model.map(_model_label) == m)]
            k = len(g)
            for s, (_, r) in enumerate(g.iterrows()):
                cat = cell_category(r)
                ax.add_patch(plt.Rectangle((j + s / k, i), 1 / k, 1, facecolor=VERDICT_COLORS[cat],
                                           edgecolor="white", lw=0.6))
                same = r["verdict"] in ("supported", "not supported") and r.get("null_verdict") == r["verdict"]
                if same:
                    ax.text(j + (s + 0.5) / k, i + 0.5, "=", ha="center", va="center", fontsize=8, color="#333333")
    ax.set_xlim(0, len(models))
    ax.set_ylim(len(claims), 0)
    ax.set_xticks(np.arange(len(models)) + 0.5, models, rotation=20, ha="right", fontsize=8)
    ax.set_yticks(np.arange(len(claims)) + 0.5, claims, fontsize=7)
    ax.tick_params(length=0)
    for sp in ax.spines.values():
        sp.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c) for c in VERDICT_COLORS.values()]
    ax.legend(handles, list(VERDICT_COLORS), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=7,
              frameon=False)
    ax.set_title("Claims x models ('=': the null model gives the same verdict; stripes: settings)", fontsize=8,
                 pad=34)
    save_figure(fig, paths)


def _decides_on_published(rule: dict) -> bool:
    """The rule compares the decided column with the published value itself (so its range belongs on the axis)."""
    inner = rule.get("inner") or {}
    return (rule.get("kind") == "inside_published_range" or inner.get("kind") == "inside_published_range"
            or isinstance(rule.get("threshold"), str))


def _published_marks(claim_id: str, model: str):
    """(published range (lo, hi) or None, [official-code values], numeric decision threshold or None) of a claim
    for ``model``; the range and the official code's values only where the rule decides on the published value
    (a claim on delta_pc12 shows Paper III's PC1+PC2 in the scorecard, not on the delta's axis)."""
    from llmgeom.analyses.claims import published_range
    from llmgeom.core.claims_data import load_claims
    from llmgeom.core.published import entries_by_kind

    c = next((c for c in load_claims() if c["id"] == claim_id), None)
    if c is None:
        return None, [], None
    rule = c.get("rule") or {}
    thr = rule.get("threshold")
    thr = float(thr) if isinstance(thr, (int, float)) else None
    if rule.get("kind") in ("ci_excludes_zero_positive", "ci_excludes_zero_negative"):
        thr = 0.0
    if not c.get("published") or not _decides_on_published(rule):
        return None, [], thr
    pr = published_range(c, model, {})
    rng = (pr[0], pr[1]) if pr else None
    oc = entries_by_kind(c["published"], model, c.get("kind")).get("official_code", [])
    return rng, [e["value"] for e in oc if "value" in e], thr


def forest_plots(card: pd.DataFrame, paths) -> None:
    """One forest plot per numeric claim (a panel each): per model and setting the measured value with its
    interval (black), the null model's value (hollow circle), the data-level null (x), the decision threshold
    (dashed), and where the rule decides on the published value its range (shaded band: the paper's, or the
    source its tier names) and the official code's values (diamonds).

    Args:
        card: the scorecard (claims.csv). paths: output files (PNG, PDF).
    """
    num = card[np.isfinite(pd.to_numeric(card.measured, errors="coerce"))]
    claims = list(dict.fromkeys(num.claim_id))
    fig, axes, nrow = panel_grid(len(claims), 3, 2.1)
    for ax, c in zip(axes.flat, claims):
        g = num[num.claim_id == c].reset_index(drop=True)
        labels = [f"{_model_label(m)}" + (f" ({s})" if s else "") for m, s in zip(g.model, g.setting)]
        y = np.arange(len(g))
        rng, oc, thr = _published_marks(c, str(g.model.iloc[0]))
        if thr is not None:
            ax.axvline(thr, color="#636363", ls="--", lw=0.8, label="decision threshold")
        if rng:
            lo, hi = rng
            if np.isfinite(lo) and np.isfinite(hi) and hi > lo:
                ax.axvspan(lo, hi, color="#9ecae1", alpha=0.5, lw=0, label="published range")
            elif np.isfinite(lo):
                ax.axvline(lo, color="#3182bd", lw=1, label="published")
        for v in oc:
            ax.plot([v] * len(g), y, "D", color="#756bb1", ms=4, label="official code")
        m = pd.to_numeric(g.measured, errors="coerce").to_numpy(float)
        lo = pd.to_numeric(g.measured_lo, errors="coerce").to_numpy(float)
        hi = pd.to_numeric(g.measured_hi, errors="coerce").to_numpy(float)
        ok = np.isfinite(lo) & np.isfinite(hi)
        ax.errorbar(m[ok], y[ok], xerr=[m[ok] - np.minimum(lo[ok], m[ok]), np.maximum(hi[ok], m[ok]) - m[ok]],
                    fmt="none", ecolor="black", lw=1)
        ax.plot(m, y, "o", color="black", ms=4, label="measured")
        nm = pd.to_numeric(g.null_measured, errors="coerce").to_numpy(float)
        ax.plot(nm, y, "o", mfc="white", mec="#d73027", ms=5, label="null model")
        if "noise_measured" in g:
            nz = pd.to_numeric(g.noise_measured, errors="coerce").to_numpy(float)
            if np.isfinite(nz).any():
                ax.plot(nz, y, "x", color="#d73027", ms=5, label="noise (same n, d)")
        ax.set_yticks(y, labels, fontsize=6)
        ax.set_ylim(len(g) - 0.5, -0.5)
        ax.set_title(c, fontsize=7)
        ax.tick_params(axis="x", labelsize=6)
    shared_legend(fig, axes, fontsize=7, nrow=nrow, top=0.25)
    save_figure(fig, paths)


def _img(path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


#: one symbol per headline category, so that a cell reads without its colour
VERDICT_SYMBOLS = {"specific finding": "\u2713", "specific, unstable": "~", "supported, not specific": "=",
                   "not supported": "\u2717", "inconclusive": "?", "not testable here": "\u2013"}


def _columns(card: pd.DataFrame) -> list[tuple[str, str, bool]]:
    """Columns of the HTML verdict matrix: (header, model label, null) per model, each trained model followed by
    its twin (the null verdicts of its rows), "all models" (across-model claims) and the twins' series last."""
    models = [m for m in dict.fromkeys(_model_label(m) for m in card.model) if m != "(any)"]
    models = [m for m in models if m != "all models"] + (["all models"] if "all models" in models else [])
    nulls = dict(zip(card.model.map(_model_label), card.null_model))
    cols = []
    for m in models + (["(any)"] if (card.model == "(any)").any() else []):
        cols.append((m, m, False))
        twin = nulls.get(m, "")
        cols.append(("twins" if m == "all models" else (twin if isinstance(twin, str) and twin else "twin"), m, True))
    return cols


def _null_category(r) -> str:
    v = r["null_verdict"] if isinstance(r["null_verdict"], str) and r["null_verdict"] else "not testable here"
    return "supported, not specific" if v == "supported" else v


def _cell(g: pd.DataFrame, null: bool) -> str:
    """One cell: a stripe per setting (prompt set, run, ...) with the category's colour and symbol; the title (on
    hover) gives setting, verdict and reason."""
    esc = html.escape
    parts = []
    for _, r in g.iterrows():
        cat = _null_category(r) if null else cell_category(r)
        why = r["null_reason"] if null else r["reason"]
        st = _stability(r)
        unstable = not null and is_unstable(r)
        stab = "" if null or not np.isfinite(st) else f" (stability {st:.2f}{', unstable' if unstable else ''})"
        tip = f"{r['setting'] + ': ' if r['setting'] else ''}{cat}{stab}; {why}"
        sym = VERDICT_SYMBOLS[cat] + ("~" if unstable and cat != "specific, unstable" else "")
        parts.append(f'<span class="s" style="background:{VERDICT_COLORS[cat]}" title="{esc(str(tip))}">'
                     f"{sym}</span>")
    return "".join(parts)


def matrix_html(card: pd.DataFrame) -> str:
    """The claims x models verdict matrix as an HTML table (real text, readable at any zoom): a row per claim (its
    id; the sentence on hover), a column per model followed by its twin's column (the same claim decided on the
    random-init twin), a stripe per setting with the verdict's colour and symbol (:data:`VERDICT_SYMBOLS`)."""
    esc = html.escape
    card = card.reset_index(drop=True)
    cols = _columns(card)
    labels = card.model.map(_model_label)
    head = "".join(f'<th class="{"n" if null else "m"}">{esc(h).replace("-", "-<wbr>")}</th>' for h, _, null in cols)
    body = []
    for c in dict.fromkeys(card.claim_id):
        mine = card.claim_id == c
        rows = card[mine]
        cells = "".join(f'<td class="{"n" if null else "m"}">{_cell(card[mine & (labels == m)], null)}</td>'
                        for _, m, null in cols)
        body.append(f'<tr><th class="c" title="{esc(str(rows.claim.iloc[0]))}">{esc(c)}</th>{cells}</tr>')
    return f'<table class="vm"><tr><th></th>{head}</tr>{"".join(body)}</table>'


_STYLE = """body{font-family:sans-serif;margin:6px 10px;font-size:12px} h1{font-size:16px;margin:2px 0 4px}
h2{font-size:15px} p{margin:4px 0} .wrap{display:flex;gap:12px;align-items:flex-start}
.side{flex:1 1 220px;min-width:200px} .chip{display:block;padding:2px 6px;border-radius:4px;margin:2px 0;font-size:12px}
table.vm{border-collapse:collapse;font-size:11px;line-height:13px} table.vm th,table.vm td{padding:1px 3px;
border-bottom:1px solid #eee} table.vm th.c{text-align:left;font-weight:normal;white-space:nowrap}
table.vm tr:first-child th{vertical-align:bottom;font-size:11px;max-width:78px} table.vm th.n{color:#b2182b}
table.vm td.n{border-right:1px solid #999} .s{display:inline-block;min-width:13px;text-align:center;margin-right:1px;
border-radius:2px;font-size:11px} img{max-width:100%} .figs img{max-width:32%}
.drift{border:2px solid #b2182b;background:#fde0dd;padding:4px 8px;margin:4px 0} .drift table{border-collapse:collapse;
font-size:11px} .drift td,.drift th{padding:1px 4px;border-bottom:1px solid #f4a582;text-align:left} .ok{color:#1a9850}"""


#: the most drifted headline values the front page lists (the rest: results/summary/drift.csv)
DRIFT_ROWS_SHOWN = 40


def drift_html(drift: pd.DataFrame | None, reference_path: str = "") -> str:
    """The front page's first lines on the headline reference (:func:`llmgeom.analyses.drift.drift_table`): a red
    box listing the values outside their tolerance (statistic, model, reference, value, tolerance, note; the first
    :data:`DRIFT_ROWS_SHOWN`), or one line saying that all are within the reference; "" without a reference
    (``drift`` None).

    Args:
        drift: results/summary/drift.csv (read with ``keep_default_na=False``: ``within`` "True" / "False") or None.
        reference_path: the reference file, named in the text.
    """
    if drift is None:
        return ""
    esc = html.escape
    bad = drift[~drift.within.map(_is_true)]
    where = esc(str(reference_path or "the reference"))
    if not len(bad):
        return (f'<p class="ok">\u2713 All {len(drift)} headline values within their tolerance of the reference '
                f"{where} (results/summary/drift.csv).</p>")
    cells = ("statistic", "model", "reference", "value", "tolerance", "note")
    head = "".join(f"<th>{c}</th>" for c in cells)
    body = "".join("<tr>" + "".join(f"<td>{esc(str(r[c]))}</td>" for c in cells) + "</tr>"
                   for _, r in bad.head(DRIFT_ROWS_SHOWN).iterrows())
    more = (f"<p>... and {len(bad) - DRIFT_ROWS_SHOWN} more in results/summary/drift.csv.</p>"
            if len(bad) > DRIFT_ROWS_SHOWN else "")
    return (f'<div class="drift"><b>\u26a0 {len(bad)} of {len(drift)} headline values outside their tolerance of '
            f"the reference {where}</b> (results/summary/drift.csv; a change that moves them rewrites the reference "
            f"with its reason: docs/testing.md, \"Headline reference\")<table><tr>{head}</tr>{body}</table>{more}</div>")


def findings_page(card: pd.DataFrame, matrix_png, forest_png, out, *, title: str = "What this run found",
                  scaling_pngs=(), drift: pd.DataFrame | None = None, reference_path: str = "") -> None:
    """The front page (``results/index.html``): the headline counts and the verdict matrix on the first screen (an
    HTML table, :func:`matrix_html`, readable at 1280 x 800 with eight models and their twins), then the forest
    plots, the scaling figures and the list of specific findings: one self-contained HTML file (figures embedded).

    Args:
        card: the scorecard; matrix_png / forest_png: :func:`verdict_matrix` / :func:`forest_plots` PNGs (the
        matrix PNG is the report's copy: linked, not shown); out: the HTML path (written atomically);
        scaling_pngs: the scaling figures (:func:`llmgeom.plots.scaling.scaling_figures`), shown in a grid.
        drift, reference_path: results/summary/drift.csv and the study's reference file: the headline values
        outside their tolerance at the top of the page (:func:`drift_html`); None: no reference, no box.
    """
    from llmgeom.analyses.claims import STABLE, headline
    from llmgeom.core.io import write_text

    counts = headline(card)
    esc = html.escape
    chips = "".join(f'<span class="chip" style="background:{VERDICT_COLORS[k]}">{VERDICT_SYMBOLS[k]} {esc(k)}: '
                    f"<b>{v}</b></span>" for k, v in counts.items())
    spec = card[card.apply(cell_category, axis=1) == "specific finding"]
    items = "".join(f"<li><b>{esc(r.claim_id)}</b> on {esc(str(r.model))}{' (' + esc(str(r.setting)) + ')' if isinstance(r.setting, str) and r.setting else ''}: "
                    f"{esc(str(r.measured_text))}; null {esc(str(r.null_model))}: {esc(str(r.null_verdict))} "
                    f"({esc(str(r.specific_reason))})</li>" for r in spec.itertuples()) or "<li>none</li>"
    figs = "".join(f'<img alt="{esc(Path(p).stem)}" src="{_img(p)}">' for p in scaling_pngs)
    scaling = (f"<h2>Scaling: each statistic against the parameter count (this run, random-init twins, the papers' "
               f"models)</h2><p>Table: results/summary/scaling.csv; across-size claims: the rows of the matrix above "
               f"decided on it (docs/claims.md).</p><div class=\"figs\">{figs}</div>" if figs else "")
    page = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>{_STYLE}</style></head><body>
{drift_html(drift, reference_path)}
<h1>{esc(title)}: {len(card)} verdicts on {card.claim_id.nunique()} claims</h1>
<div class="wrap"><div>{matrix_html(card)}</div><div class="side">{chips}
<p>Columns: each model, then its <span style="color:#b2182b">random-init twin</span> (the same claim decided on the
twin: its null); <i>all models</i>: the across-model claims, then the twins' series. Stripes: the claim's settings
(prompt set, run); hover a stripe for its verdict and reason, a claim for its sentence.</p>
<p>A supported verdict is a <b>finding</b> (\u2713) only when it is specific (every null's verdict decided and
different) and <b>stable</b>: re-decided the same on at least {STABLE:.0%} of the resamples its interval drew
(claims.csv <code>stability</code>); "~" marks a verdict below that (unstable, or not re-decided), "=" one its null
shares. The counts count stable specific findings only; sensitivity rows (another size axis) are shown, not counted. Scorecard: results/summary/claims.csv | .html;
columns and rules: docs/claims.md; the matrix as a figure: results/figures/claims_matrix.png.</p></div></div>
<h2>Specific findings</h2><ul>{items}</ul>
<h2>Forest plots: measured (interval), null model, noise, published range, official code</h2>
<img alt="forest plots" src="{_img(forest_png)}">
{scaling}
</body></html>
"""
    write_text(page, out)
