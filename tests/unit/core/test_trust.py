"""A NaN in a stored array is refused with the file, dataset, layer and first bad row (issue 11, point 6)."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from llmgeom.core.store import NonFiniteDataError, StoreError, open_activations, read_finite
from llmgeom.core.writer import ActivationWriter


@pytest.fixture()
def h5(tmp_path):
    rng = np.random.default_rng(0)
    n, L, F, d = 12, 3, 6, 5
    path = tmp_path / "mixed.h5"
    shapes = {"last_token/values": ((n, L, F), "float32"), "last_token/residual": ((n, L + 1, d), "float32"),
              "last_token/attn_output": ((n, L, F), "float32"),
              "next_token/entropy": ((n,), "float32"), "prompts/meta": ((n,), "str")}
    w = ActivationWriter(path, {"model": "m", "prompt_set": "mixed"}, shapes)
    w.write("last_token/values", slice(None), rng.standard_normal((n, L, F)).astype(np.float32))
    w.write("last_token/residual", slice(None), rng.standard_normal((n, L + 1, d)).astype(np.float32))
    w.write("last_token/attn_output", slice(None), rng.standard_normal((n, L, F)).astype(np.float32))
    w.write("next_token/entropy", slice(None), rng.uniform(0, 3, n).astype(np.float32))
    w.write("prompts/meta", slice(None), ['{"topic": "a"}'] * n)
    w.commit()
    return path


def _plant_nan(src, dst, name, index):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        f[name][index] = np.nan  # what a copied-in or altered file can hold; the writer never writes one
    return dst


def test_read_finite_reads_and_names_the_first_bad_value(h5, tmp_path):
    with open_activations(h5, model="m") as f:
        a = read_finite(f, "last_token/values", layer=1)
        assert a.shape == (12, 6) and a.dtype == np.float64
        assert read_finite(f, "last_token/residual", [2, 5]).shape == (2, 4, 5)
    bad = _plant_nan(h5, tmp_path / "copy.h5", "last_token/values", (7, 2, 4))
    with open_activations(bad, model="m") as f:
        read_finite(f, "last_token/values", layer=1)  # the other layers are fine
        with pytest.raises(NonFiniteDataError) as e:
            read_finite(f, "last_token/values", layer=2)
        msg = str(e.value)
        assert str(bad) in msg and "'last_token/values'" in msg and "layer 2" in msg and "prompt row 7" in msg
        with pytest.raises(NonFiniteDataError, match=r"layer 2, prompt row 7"):
            read_finite(f, "last_token/values", [1, 7, 9])  # row of the file, layer found in the data
    assert issubclass(NonFiniteDataError, StoreError)


def test_every_analysis_refuses_a_planted_nan_with_the_message(h5, tmp_path):
    from llmgeom.analyses.domain_restriction import domain_restriction_tables
    from llmgeom.analyses.value_manifold import value_manifold_table

    bad = _plant_nan(h5, tmp_path / "copied.h5", "last_token/residual", (3, 2, 0))
    with pytest.raises(NonFiniteDataError, match=r"'last_token/residual', layer 2, prompt row 3"):
        value_manifold_table({"mixed": bad}, model="m", n_boot=5, seed=0, ci=0.95, layers="all")
    with pytest.raises(NonFiniteDataError, match=r"'last_token/residual', layer 2, prompt row 3"):
        domain_restriction_tables({"mixed": bad}, model="m", mixed_set="mixed", n_quantiles=2, per_quantile=6,
                                  n_boot=5, labels=None, edges="per_set", ci=0.95, seed=0, layers="all", data_reps=0)
    ent = _plant_nan(h5, tmp_path / "ent.h5", "next_token/entropy", 5)
    with pytest.raises(NonFiniteDataError, match=r"'next_token/entropy', no layer axis, prompt row 5"):
        value_manifold_table({"mixed": ent}, model="m", n_boot=5, seed=0, ci=0.95, layers="all")
