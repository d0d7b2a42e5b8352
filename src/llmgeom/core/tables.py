"""The key of each summary table and the names of the intrinsic-dimension quantities: one place for both.

A table's key is the set of columns that names one row: no two rows of a table may share it (a reader that looks a
row up by fewer columns can get two different statistics and take the wrong one: id_profile once held a
token-position and a last-token TwoNN row per model that differed only in a column the readers did not filter on).
:data:`TABLE_KEYS` declares the key of every table it lists, for the per-model table
``results/{model}/tables/<name>.csv`` and the cross-model one ``results/summary/<name>.csv`` alike; the columns of
:data:`OPTIONAL_KEY_COLUMNS` belong to the key where a table has them (``source``: the summary tables add published
rows beside the measured ones). :func:`duplicate_keys` finds the rows that break it (tests/workflow/test_workflow.py
runs it over the tiny study's outputs).

May import: the standard library and (lazily) pandas. Nothing of llmgeom.
"""

from __future__ import annotations

#: values of the ``quantity`` column of intrinsic_dimension.csv, id_last_token.csv, gride_scale.csv and
#: id_profile.csv: which intrinsic dimension a row measures (docs/reading-the-numbers.md, "Which ID")
TOKEN_ID = "token_id"
TOKEN_ID_CROSS_PASSAGE = "token_id_cross_passage"
LAST_TOKEN_ID = "last_token_id"
QUANTITIES = {TOKEN_ID: "residual stream at sampled corpus token positions (LSM's points)",
              TOKEN_ID_CROSS_PASSAGE: "the same points, TwoNN with each point's two nearest neighbours taken among the "
                                      "points of other passages (tests for a same-passage artefact)",
              LAST_TOKEN_ID: "residual stream at the last token of each prompt of a prompt set (Cheng, Vaidya & "
                             "Antonello's points)"}

#: columns that are part of a table's key where the table has them
OPTIONAL_KEY_COLUMNS = ("source",)

#: table name -> its key columns (plus :data:`OPTIONAL_KEY_COLUMNS` where present)
TABLE_KEYS = {
    "intrinsic_dimension": ("model", "prompt_set", "quantity", "estimator", "layer"),
    "id_last_token": ("model", "prompt_set", "quantity", "estimator", "layer"),
    "gride_scale": ("model", "prompt_set", "quantity", "layer", "n1"),
    "id_profile": ("model", "prompt_set", "quantity", "estimator"),
    "curvature": ("model", "prompt_set", "layer"),
    "rate_distortion": ("model", "prompt_set", "states", "layer"),
    "margins": ("model", "prompt_set"),
    "expressibility_gap": ("model", "prompt_set"),
    "scaling": ("statistic", "model", "source", "prompt_set"),
    "claims": ("claim_id", "model", "setting"),
}


def key_columns(table: str, columns=None) -> list[str]:
    """The key of ``table`` (:data:`TABLE_KEYS`), with the optional key columns present in ``columns``.

    Raises:
        KeyError: a table without a declared key.
    """
    key = list(TABLE_KEYS[table])
    return key + [c for c in OPTIONAL_KEY_COLUMNS if c not in key and columns is not None and c in columns]


def duplicate_keys(df, table: str):
    """The rows of ``df`` (a ``<table>.csv`` read back) whose key another row shares, sorted by the key.

    Args:
        df: pandas DataFrame of the table. table: its name (a key of :data:`TABLE_KEYS`).

    Returns:
        DataFrame: the offending rows' key columns (empty when every key is unique).

    Raises:
        KeyError: undeclared table, or a key column missing from ``df`` (names it: a renamed column, not a pass).
    """
    key = key_columns(table, df.columns)
    missing = [c for c in key if c not in df.columns]
    if missing:
        raise KeyError(f"table {table} lacks its key column(s) {missing} (key: {key})")
    k = df[key].astype(str)  # NaN keys (e.g. an empty prompt_set) compare equal as text
    return df.loc[k.duplicated(keep=False), key].sort_values(key)
