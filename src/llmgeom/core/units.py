"""Units: entropies are stored in nats (HDF5 contract) and reported in bits where a paper does.

May import: numpy. Nothing of llmgeom.
"""

from __future__ import annotations

import numpy as np

LN2 = float(np.log(2.0))  # nats per bit


def nats_to_bits(x):
    """Entropy in nats -> bits (array or scalar)."""
    return np.asarray(x, np.float64) / LN2


def bits_to_nats(x):
    """Entropy in bits -> nats (array or scalar)."""
    return np.asarray(x, np.float64) * LN2
