"""Layer specifications from the config -> 0-based layer indices (one resolver for every table).

May import: the standard library. Nothing of llmgeom.
"""

from __future__ import annotations

NAMED_LAYERS = ("first", "middle", "last")


def select_layers(spec, n_layers: int, *, key: str = "layers", among=None) -> list[int]:
    """Resolve a layer specification to sorted, distinct 0-based indices.

    Args:
        spec: ``"all"`` (every layer), one of ``"first"`` (0), ``"middle"`` (n_layers // 2),
            ``"last"`` (n_layers - 1), or a list of such names and integers (negative counts from
            the end, as in Python).
        n_layers: number of layers of the array the indices address.
        key: the config key, named in the error message.
        among: the layers a measure can use, sorted (hybrid models: the layers with attention, for a measure of
            the values), or None (every layer). With it, ``"all"`` is ``among`` and the names pick within it
            (``"first"`` = among[0], ``"middle"`` = among[len // 2], ``"last"`` = among[-1]); integers stay block
            indices and must be in ``among``. ``among`` = every layer resolves as without it.

    Returns:
        list of indices in increasing order, without duplicates.

    Raises:
        ValueError: an unknown name, or an index outside ``[-n_layers, n_layers)`` or not in ``among``; the
            message names ``key``, the value and the valid range (or the usable layers); an empty ``among``.
    """
    pool = list(range(n_layers)) if among is None else sorted(int(l) for l in among)
    if not pool:
        raise ValueError(f"{key}: this model has no layers the measure can use (none with attention)")
    if spec == "all":
        return pool
    items = [spec] if isinstance(spec, (str, int)) else list(spec)
    named = {"first": pool[0], "middle": pool[len(pool) // 2], "last": pool[-1]}
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
        i = i if i >= 0 else n_layers + i
        if i not in pool:
            raise ValueError(f"{key}: layer {i} has no attention (a state-space, linear-attention or MLP-only "
                             f"block); the layers with attention are {pool}, and 'first' / 'middle' / 'last' pick "
                             "among them")
        out.add(i)
    return sorted(out)


def relative_depth(layer: int, n_layers: int, *, index: str = "block") -> float:
    """Relative depth of a layer: the number of transformer blocks applied, divided by ``n_layers`` (L).

    Args:
        layer: 0-based index. ``index="block"``: a block (values, keys, attention, or the block's output
            in the residual stream), 0..L-1 -> (layer + 1) / L. ``index="residual"``: a residual-stream
            hidden state, 0 = embeddings .. L = output of the last block -> layer / L.
        n_layers: number of transformer blocks L (>= 1).

    Returns:
        float in [1/L, 1] for blocks, [0, 1] for residual layers. The output of block b has the same
        relative depth in both indexings ((b + 1) / L), so every table uses one convention.

    Raises:
        ValueError: n_layers < 1, an unknown ``index``, or a layer outside its range.
    """
    L = int(n_layers)
    if L < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers!r}")
    if index == "block":
        if not 0 <= int(layer) < L:
            raise ValueError(f"block index {layer} outside 0..{L - 1}")
        return (int(layer) + 1) / L
    if index == "residual":
        if not 0 <= int(layer) <= L:
            raise ValueError(f"residual layer {layer} outside 0..{L}")
        return int(layer) / L
    raise ValueError(f"index must be 'block' or 'residual', got {index!r}")
