"""Layer specifications from the config -> 0-based layer indices (one resolver for every table).

May import: the standard library. Nothing of llmgeom.
"""

from __future__ import annotations

NAMED_LAYERS = ("first", "middle", "last")


def select_layers(spec, n_layers: int, *, key: str = "layers") -> list[int]:
    """Resolve a layer specification to sorted, distinct 0-based indices.

    Args:
        spec: ``"all"`` (every layer), one of ``"first"`` (0), ``"middle"`` (n_layers // 2),
            ``"last"`` (n_layers - 1), or a list of such names and integers (negative counts from
            the end, as in Python).
        n_layers: number of layers of the array the indices address.
        key: the config key, named in the error message.

    Returns:
        list of indices in increasing order, without duplicates.

    Raises:
        ValueError: an unknown name, or an index outside ``[-n_layers, n_layers)``; the message
            names ``key``, the value and the valid range.
    """
    if spec == "all":
        return list(range(n_layers))
    items = [spec] if isinstance(spec, (str, int)) else list(spec)
    named = {"first": 0, "middle": n_layers // 2, "last": n_layers - 1}
    out: set[int] = set()
    for x in items:
        if isinstance(x, str):
            if x not in named:
                raise ValueError(f"{key}: {x!r} is not a layer; valid: 'all', {', '.join(map(repr, NAMED_LAYERS))} "
                                 f"or integers in [{-n_layers}, {n_layers - 1}]")
            out.add(named[x])
            continue
        i = int(x)
        if not -n_layers <= i < n_layers:
            raise ValueError(f"{key}: layer {i} is outside this model's {n_layers} layers; valid: integers in "
                             f"[{-n_layers}, {n_layers - 1}] (negative counts from the end) or "
                             f"{', '.join(map(repr, NAMED_LAYERS))}")
        out.add(i if i >= 0 else n_layers + i)
    return sorted(out)
