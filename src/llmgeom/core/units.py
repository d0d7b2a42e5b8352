"""Units: entropies are stored in nats (HDF5 contract) and reported in bits where a paper does.

May import: numpy. Nothing of llmgeom.
"""

from __future__ import annotations

import numpy as np

LN2 = float(np.log(2.0))  # nats per bit


def nats_to_bits(x):
    """Entropy (or KL divergence) in nats -> bits: ``x / ln 2``.

    Parameters
    ----------
    x : float, numpy array of any shape, or torch tensor
        Values in nats.

    Returns
    -------
    Same type, shape and dtype as ``x`` (a float32 array stays float32, so tables keep their digits),
    in bits.

    Source: DESIGN.md sec. 2 (the HDF5 contract stores nats; Paper I-III report bits).
    """
    return x / LN2
