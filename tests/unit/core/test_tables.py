"""Table keys (llmgeom.core.tables): one place, and the readers that depend on them."""

from __future__ import annotations

import pandas as pd
import pytest

from llmgeom.core.tables import OPTIONAL_KEY_COLUMNS, QUANTITIES, TABLE_KEYS, duplicate_keys, key_columns


def test_duplicate_keys_finds_rows_that_share_a_key():
    df = pd.DataFrame(dict(model=["a", "a", "b"], prompt_set="corpus", quantity=["token_id", "last_token_id", "x"],
                           estimator="twonn", peak_id=[11.0, 20.0, 3.0]))
    assert duplicate_keys(df, "id_profile").empty
    # the bug of issue 48: two twonn rows of a model that differ only in a column outside the key
    bad = df.drop(columns="quantity").assign(quantity="token_id", points=["token positions", "last token", "t"])
    dup = duplicate_keys(bad, "id_profile")
    assert list(dup.model) == ["a", "a"] and list(dup.columns) == list(TABLE_KEYS["id_profile"])
    with pytest.raises(KeyError, match="lacks its key column"):
        duplicate_keys(df.drop(columns="quantity"), "id_profile")
    with pytest.raises(KeyError):
        duplicate_keys(df, "no_such_table")
    # source is part of the key where a table has it (summary tables: published rows beside measured ones)
    pub = pd.concat([df.assign(source="measured"), df.assign(source="published")])
    assert key_columns("id_profile", pub.columns)[-1] == "source" and duplicate_keys(pub, "id_profile").empty
    assert "source" in OPTIONAL_KEY_COLUMNS and set(QUANTITIES) == {"token_id", "token_id_cross_passage",
                                                                  "last_token_id"}


def test_trajectory_keeps_the_quantities_apart():
    from llmgeom.analyses.checkpoint_trajectory import trajectory_table

    idp = pd.DataFrame(dict(model=["p-0"] * 3, prompt_set="corpus", quantity=["token_id", "last_token_id", "token_id"],
                            estimator=["twonn", "twonn", "mle_mg"], peak_id=[11.0, 20.0, 13.0]))
    df = trajectory_table({"id_profile": idp}, {"p-0": 0}, {"p-0": "p"}).set_index("metric")
    assert df.loc["peak_id [quantity=token_id, estimator=twonn]", "value"] == 11.0
    assert df.loc["peak_id [quantity=last_token_id, estimator=twonn]", "value"] == 20.0
    assert len(df) == 3 and (df.n_rows == 1).all()
