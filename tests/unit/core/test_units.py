"""core.units: the one nats -> bits conversion (DESIGN.md sec. 2: nats stored, bits reported)."""
import math

import numpy as np
import torch

from llmgeom.core.units import nats_to_bits


def test_nats_to_bits_known_answers_and_dtypes():
    assert nats_to_bits(math.log(2)) == 1.0
    assert nats_to_bits(math.log(8)) == 3.0
    x32 = np.log(np.array([1.0, 4.0, 1024.0], dtype=np.float32))
    out = nats_to_bits(x32)
    assert out.dtype == np.float32  # tables keep the digits they had with `x / log 2`
    np.testing.assert_allclose(out, [0.0, 2.0, 10.0], atol=1e-6)
    t = nats_to_bits(torch.log(torch.tensor([2.0, 16.0], dtype=torch.float64)))
    assert t.dtype == torch.float64 and t.tolist() == [1.0, 4.0]
