"""Wind-tunnel tasks as data: spec checks, seeded sequences, token layout and prompt records (numpy only).

The exact posteriors these records carry (bijection elimination, the HMM forward algorithm) are pure maths
in :mod:`llmgeom.measures.bayes`; training on these sequences is :mod:`llmgeom.wind_tunnel.train`. No torch,
ever: the workflow's config checks read :func:`check_task`.

Source: Paper I, "The Bayesian Geometry of Transformer Attention" (bijection elimination and HMM
filtering); DESIGN.md section 3, "Wind tunnel". Entropies are in **bits** everywhere (``_bits``);
the only natural-log quantity is the HMM log-likelihood (``loglik_nats``).

Tasks (one ``spec`` dict per task, checked by :func:`check_task`; config key
``wind_tunnel.tasks.<name>``):

* ``kind: bijection`` (keys ``V``, ``n_pairs``). Per sequence a fresh uniformly random bijection
  pi on V symbols and n_pairs distinct inputs x_0, x_1, ... in uniformly random order; the sequence
  lists the pairs (x_t, pi(x_t)). Before pi(x_t) is shown, t outputs are used, and the exact
  posterior over pi(x_t) is uniform on the V - t unused outputs: entropy log2(V - t) bits.
  Text: ``"x3 y7 x1 y2 x5"`` (inputs ``x0..x{V-1}``, outputs ``y0..y{V-1}``). The answer at cut t
  (t = 0 .. n_pairs - 1) is the output after ``x_t``; the prompt ends with ``x_t``.

* ``kind: hmm`` (keys ``n_states`` K, ``n_obs`` M, ``length`` L, ``hmm_seed``, ``concentration``;
  or explicit ``transition`` [K, K], ``emission`` [K, M] and optional ``initial`` [K]).
  **Design: one fixed HMM per task** (not one per sequence), drawn once from ``hmm_seed``: each row
  of the transition and emission matrices ~ Dirichlet(concentration * 1), the initial distribution
  ~ Dirichlet(1); or given explicitly. Hidden states s_1 ~ initial, s_{t+1} ~ transition[s_t],
  observations o_t ~ emission[s_t]. The model sees only observations (``"o2 o0 o1"``, symbols
  ``o0..o{M-1}``) and learns the fixed parameters in its weights, so the Bayes-optimal next-token
  distribution of a causal LM is exactly the predictive p(o_{t+1} | o_1..t) of the forward algorithm
  (a per-sequence random HMM would need an integral over parameters, with no closed form). The answer
  at cut t (t = 1 .. L - 1 observations shown) is o_{t+1}; the prompt ends with o_t. The filtering
  posterior p(s_t | o_1..t) is stored beside it.

Token layout (:func:`vocabulary`): ``<pad> <bos> <eos> <unk>`` (ids 0-3), then the task's symbols;
every sequence starts with ``<bos>`` (the tokenizer's post-processor prepends it to prompt text).

Seeds (:func:`stream_rng`): every random stream is ``numpy.random.default_rng(SeedSequence(seed,
spawn_key=(stream,)))`` with ``stream`` = :data:`STREAM_TRAIN` (0, training batches),
:data:`STREAM_VALID` (1, validation during training) or :data:`STREAM_PROMPTS` (2, prompt sets).
Streams with different spawn keys are statistically independent even for the same integer seed, so
held-out prompts never reuse the training draws. (Exact disjointness of sequences is not enforced;
for V = 10, 9 pairs there are 10!^2 ~ 1.3e13 sequences, so a collision is negligible.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from llmgeom.measures.bayes import bijection_entropy_bits, hmm_forward
from llmgeom.prompts.io import CANDIDATES_KEY

__all__ = [
    "KINDS",
    "SPECIAL_TOKENS",
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "UNK_ID",
    "STREAM_TRAIN",
    "STREAM_VALID",
    "STREAM_PROMPTS",
    "CANDIDATES_KEY",
    "check_task",
    "stream_rng",
    "sample_bijection",
    "random_hmm",
    "hmm_parameters",
    "sample_hmm",
    "vocabulary",
    "answer_token_ids",
    "sequence_length",
    "query_positions",
    "sequence_tokens",
    "sequence_text",
    "sample_batch",
    "prompt_records",
]

#: Task kinds understood by :func:`check_task`.
KINDS = ("bijection", "hmm")

#: Special tokens, always the first four ids of :func:`vocabulary`.
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

#: Spawn keys of the random streams (see the module docstring).
STREAM_TRAIN, STREAM_VALID, STREAM_PROMPTS = 0, 1, 2

#: Key in a prompt's ``meta`` holding the token ids of the answer symbols (the extraction's
#: ``candidates_key``); ``meta["posterior"][i]`` is the exact probability of ``candidate_token_ids[i]``.

_ROW_TOL = 1e-6
_ALLOWED = {
    "bijection": {"kind", "V", "n_pairs"},
    "hmm": {"kind", "n_states", "n_obs", "length", "hmm_seed", "concentration",
            "transition", "emission", "initial"},
}
_HMM_DEFAULTS = {"hmm_seed": 0, "concentration": 0.5}


# --------------------------------------------------------------------------------------------
# Parameter checks
# --------------------------------------------------------------------------------------------


def _key(name: str, field: str) -> str:
    return f"wind_tunnel.tasks.{name}.{field}"


def _int(spec: Mapping, name: str, field: str, lo: int, what: str) -> int:
    v = spec.get(field)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{_key(name, field)} = {v!r}: must be an integer >= {lo} ({what})")
    return int(v)


def _stochastic(value, name: str, field: str, shape: tuple[int | None, ...]) -> np.ndarray:
    """A non-negative float64 array of ``shape`` (None = any) whose last axis sums to 1."""
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{_key(name, field)}: must be a numeric array ({exc})") from exc
    if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, a.shape)) or 0 in a.shape:
        want = " x ".join("?" if s is None else str(s) for s in shape)
        raise ValueError(f"{_key(name, field)}: shape {list(a.shape)}, expected [{want}]")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{_key(name, field)}: entries must be finite and >= 0 (a probability "
                         f"{'vector' if a.ndim == 1 else 'matrix, one distribution per row'})")
    s = a.sum(-1)
    bad = np.flatnonzero(np.abs(np.atleast_1d(s) - 1.0) > _ROW_TOL)
    if bad.size:
        where = "the vector" if a.ndim == 1 else f"row {int(bad[0])}"
        raise ValueError(f"{_key(name, field)}: {where} sums to {float(np.atleast_1d(s)[bad[0]]):.6g}; "
                         f"every {'vector' if a.ndim == 1 else 'row'} must sum to 1 (tolerance {_ROW_TOL})")
    return a


def check_task(name: str, spec: Mapping) -> dict:
    """Validate one wind-tunnel task spec before any job runs (Paper I tasks; DESIGN.md sec. 3).

    Args:
        name: the task's name (config key ``wind_tunnel.tasks.<name>``), used in messages.
        spec: ``{"kind": "bijection", "V": int >= 2, "n_pairs": 1 <= int <= V}`` or
            ``{"kind": "hmm", "n_states": int >= 2, "n_obs": int >= 2, "length": int >= 2,
            "hmm_seed": int >= 0 (default 0), "concentration": float > 0 (default 0.5)}``, or for
            ``hmm`` explicit ``transition`` [K, K] and ``emission`` [K, M] (together), optional
            ``initial`` [K] (default uniform), each non-negative with rows summing to 1.

    Returns:
        A normalized copy of the spec: defaults filled in; for an explicit HMM ``n_states`` and
        ``n_obs`` are inferred from the matrices and the matrices become nested lists of floats.

    Raises:
        ValueError: naming the key (``wind_tunnel.tasks.<name>.<field>``) and what is valid, for:
            a spec that is not a mapping, an unknown kind, unknown keys, V < 2, n_pairs < 1 or
            n_pairs > V, bad HMM sizes, a transition / emission / initial that is not stochastic
            (negative entries or rows not summing to 1) or whose shape disagrees with the sizes.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"wind_tunnel.tasks.{name}: must be a mapping with a 'kind' "
                         f"(one of {', '.join(KINDS)}), got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{_key(name, 'kind')} = {kind!r}: must be one of {', '.join(KINDS)}")
    unknown = sorted(set(spec) - _ALLOWED[kind])
    if unknown:
        raise ValueError(f"{_key(name, unknown[0])}: unknown key for a {kind} task; "
                         f"allowed keys: {', '.join(sorted(_ALLOWED[kind]))}")
    out = dict(spec)
    if kind == "bijection":
        V = _int(spec, name, "V", 2, "the number of symbols; a bijection needs at least 2")
        n_pairs = spec.get("n_pairs")
        if isinstance(n_pairs, bool) or not isinstance(n_pairs, (int, np.integer)) or not 1 <= n_pairs <= V:
            raise ValueError(f"{_key(name, 'n_pairs')} = {n_pairs!r}: must be an integer with "
                             f"1 <= n_pairs <= V = {V} (pairs have distinct inputs, so at most V of them)")
        out.update(V=V, n_pairs=int(n_pairs))
        return out
    # hmm
    for k, v in _HMM_DEFAULTS.items():
        out.setdefault(k, v)
    _int(out, name, "hmm_seed", 0, "seed of the fixed HMM's parameters")
    _int(out, name, "length", 2, "observations per sequence")
    c = out["concentration"]
    if isinstance(c, bool) or not isinstance(c, (int, float, np.floating, np.integer)) or not (
            math.isfinite(c) and c > 0):
        raise ValueError(f"{_key(name, 'concentration')} = {c!r}: must be a finite number > 0 "
                         "(Dirichlet concentration of the HMM's rows)")
    out["concentration"] = float(c)
    has_t, has_e = "transition" in spec, "emission" in spec
    if has_t != has_e:
        missing = "emission" if has_t else "transition"
        raise ValueError(f"{_key(name, missing)}: missing; give transition and emission together "
                         "(or neither, to draw them from hmm_seed)")
    if has_t:
        T = _stochastic(spec["transition"], name, "transition", (None, None))
        K = T.shape[0]
        if T.shape != (K, K):
            raise ValueError(f"{_key(name, 'transition')}: shape {list(T.shape)}, expected a square "
                             "[n_states x n_states] matrix")
        E = _stochastic(spec["emission"], name, "emission", (K, None))
        M = E.shape[1]
        for field, val in (("n_states", K), ("n_obs", M)):
            if field in spec and spec[field] != val:
                raise ValueError(f"{_key(name, field)} = {spec[field]!r} disagrees with the matrices "
                                 f"({field} = {val}); drop it or make it match")
        if K < 2 or M < 2:
            bad = "n_states" if K < 2 else "n_obs"
            raise ValueError(f"{_key(name, bad)}: the matrices give {bad} = {K if K < 2 else M}; "
                             "must be >= 2")
        init = (_stochastic(spec["initial"], name, "initial", (K,)) if "initial" in spec
                else np.full(K, 1.0 / K))
        out.update(n_states=K, n_obs=M, transition=T.tolist(), emission=E.tolist(), initial=init.tolist())
        return out
    if "initial" in spec:
        raise ValueError(f"{_key(name, 'initial')}: only with explicit transition and emission")
    out["n_states"] = _int(spec, name, "n_states", 2, "hidden states K")
    out["n_obs"] = _int(spec, name, "n_obs", 2, "observation symbols M")
    return out


def _checked(spec: Mapping) -> dict:
    return check_task(spec.get("name", "<task>") if isinstance(spec, Mapping) else "<task>",
                      {k: v for k, v in spec.items() if k != "name"} if isinstance(spec, Mapping) else spec)


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def stream_rng(seed: int, stream: int) -> np.random.Generator:
    """The numpy Generator of one random stream: ``default_rng(SeedSequence(seed, spawn_key=(stream,)))``.

    ``stream`` is :data:`STREAM_TRAIN`, :data:`STREAM_VALID` or :data:`STREAM_PROMPTS`; streams with
    different keys are independent for the same ``seed``. Deterministic.
    """
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(int(stream),)))



# --------------------------------------------------------------------------------------------
# Sampling (Paper I); the exact posteriors are in llmgeom.measures.bayes
# --------------------------------------------------------------------------------------------


def sample_bijection(V: int, n_pairs: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` bijection-elimination sequences (Paper I).

    Per sequence: a uniform random permutation pi of ``range(V)`` and ``n_pairs`` distinct inputs in
    uniform random order. Deterministic given the Generator's state.

    Returns:
        ``(xs, ys)``, both int64 [n, n_pairs]: inputs x_t and outputs y_t = pi(x_t).

    Raises:
        ValueError: V < 2 or n_pairs outside 1..V.
    """
    check_task("<sample>", {"kind": "bijection", "V": V, "n_pairs": n_pairs})
    xs = np.argsort(rng.random((n, V)), axis=1)[:, :n_pairs]
    pis = np.argsort(rng.random((n, V)), axis=1)
    ys = np.take_along_axis(pis, xs, axis=1)
    return xs.astype(np.int64), ys.astype(np.int64)




def random_hmm(n_states: int, n_obs: int, seed: int, concentration: float = 0.5
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fixed random HMM drawn from ``seed`` (the task's ``hmm_seed``; Paper I HMM filtering).

    Generator ``default_rng(seed)``; draws, in this order: transition rows ~ Dirichlet(concentration)
    [K, K], emission rows ~ Dirichlet(concentration) [K, M], initial ~ Dirichlet(1) [K].

    Returns:
        ``(initial [K], transition [K, K], emission [K, M])``, float64, rows summing to 1.
    """
    rng = np.random.default_rng(int(seed))
    T = rng.dirichlet(np.full(n_states, float(concentration)), size=n_states)
    E = rng.dirichlet(np.full(n_obs, float(concentration)), size=n_states)
    init = rng.dirichlet(np.ones(n_states))
    # Dirichlet draws with tiny concentration can underflow to exact zeros; renormalize in float64.
    return init / init.sum(), T / T.sum(1, keepdims=True), E / E.sum(1, keepdims=True)


def hmm_parameters(spec: Mapping) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(initial [K], transition [K, K], emission [K, M])`` of an ``hmm`` task spec (float64).

    Explicit matrices if the spec gives them, else :func:`random_hmm` from ``hmm_seed``.

    Raises:
        ValueError: an invalid spec (see :func:`check_task`).
    """
    s = _checked(spec)
    if s["kind"] != "hmm":
        raise ValueError(f"hmm_parameters needs an hmm task, got kind {s['kind']!r}")
    if "transition" in s:
        return (np.asarray(s["initial"], np.float64), np.asarray(s["transition"], np.float64),
                np.asarray(s["emission"], np.float64))
    return random_hmm(s["n_states"], s["n_obs"], s["hmm_seed"], s["concentration"])


def sample_hmm(initial, transition, emission, length: int, n: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` state/observation sequences of ``length`` from a fixed HMM (inverse-CDF sampling).

    Returns:
        ``(states, obs)``, both int64 [n, length].
    """
    init, T, E = (np.asarray(a, np.float64) for a in (initial, transition, emission))
    cT, cE, ci = np.cumsum(T, 1), np.cumsum(E, 1), np.cumsum(init)
    states = np.empty((n, length), np.int64)
    obs = np.empty((n, length), np.int64)

    def draw(cdf_rows, u):  # cdf_rows [n, A], u [n] -> index with cdf > u (clipped for rounding)
        return np.minimum((cdf_rows <= u[:, None]).sum(1), cdf_rows.shape[1] - 1)

    s = draw(np.broadcast_to(ci, (n, ci.size)), rng.random(n))
    for t in range(length):
        states[:, t] = s
        obs[:, t] = draw(cE[s], rng.random(n))
        if t + 1 < length:
            s = draw(cT[s], rng.random(n))
    return states, obs




# --------------------------------------------------------------------------------------------
# Vocabulary and text layout
# --------------------------------------------------------------------------------------------


def vocabulary(spec: Mapping) -> list[str]:
    """Ordered token list of a task: ``<pad> <bos> <eos> <unk>`` (ids 0-3), then the symbols.

    bijection: ``x0..x{V-1}`` (ids 4..V+3) then ``y0..y{V-1}`` (ids V+4..2V+3);
    hmm: ``o0..o{M-1}`` (ids 4..M+3). Token id = list index.

    Raises:
        ValueError: an invalid spec.
    """
    s = _checked(spec)
    if s["kind"] == "bijection":
        return [*SPECIAL_TOKENS, *(f"x{i}" for i in range(s["V"])), *(f"y{i}" for i in range(s["V"]))]
    return [*SPECIAL_TOKENS, *(f"o{i}" for i in range(s["n_obs"]))]


def answer_token_ids(spec: Mapping) -> list[int]:
    """Token ids of the answer symbols, in symbol order (bijection: y0..y{V-1}; hmm: o0..o{M-1})."""
    s = _checked(spec)
    n = len(SPECIAL_TOKENS)
    if s["kind"] == "bijection":
        return list(range(n + s["V"], n + 2 * s["V"]))
    return list(range(n, n + s["n_obs"]))


def sequence_length(spec: Mapping) -> int:
    """Tokens in one full training sequence, ``<bos>`` included (bijection 1 + 2 n_pairs; hmm 1 + L)."""
    s = _checked(spec)
    return 1 + 2 * s["n_pairs"] if s["kind"] == "bijection" else 1 + s["length"]


def query_positions(spec: Mapping) -> np.ndarray:
    """Token positions (0 = ``<bos>``) whose NEXT token is an answer; the training loss uses exactly these.

    bijection: the positions of x_t, 1 + 2t for t = 0..n_pairs-1 (the next token is y_t = pi(x_t));
    hmm: 0..L-1 (position t holds o_t, the next token is o_{t+1}; position 0 predicts o_1).

    Returns:
        int64 [P] (P = n_pairs or L); query index i corresponds to t = i.
    """
    s = _checked(spec)
    if s["kind"] == "bijection":
        return 1 + 2 * np.arange(s["n_pairs"], dtype=np.int64)
    return np.arange(s["length"], dtype=np.int64)


def sequence_tokens(spec: Mapping, sample) -> list[str]:
    """Tokens (without ``<bos>``) of one sequence.

    Args:
        sample: bijection: ``(xs [P], ys [P])`` int arrays; hmm: ``obs [L]`` int array.

    Returns:
        e.g. ``["x3", "y7", "x1", "y2"]`` or ``["o2", "o0", "o1"]``.
    """
    s = _checked(spec)
    if s["kind"] == "bijection":
        xs, ys = sample
        return [tok for x, y in zip(np.asarray(xs).ravel(), np.asarray(ys).ravel()) for tok in (f"x{x}", f"y{y}")]
    return [f"o{o}" for o in np.asarray(sample).ravel()]


def sequence_text(spec: Mapping, sample, n_tokens: int | None = None) -> str:
    """Space-separated text of one sequence, optionally only its first ``n_tokens`` tokens (no ``<bos>``).

    The tokenizer built by :mod:`llmgeom.wind_tunnel.train` maps it to ``[<bos>] + ids``.
    """
    toks = sequence_tokens(spec, sample)
    return " ".join(toks if n_tokens is None else toks[:n_tokens])


def _encode(spec: dict, sample_batch) -> np.ndarray:
    n_sp = len(SPECIAL_TOKENS)
    if spec["kind"] == "bijection":
        xs, ys = sample_batch
        n, P = xs.shape
        ids = np.empty((n, 1 + 2 * P), np.int64)
        ids[:, 1::2] = n_sp + xs
        ids[:, 2::2] = n_sp + spec["V"] + ys
    else:
        obs = sample_batch
        ids = np.empty((obs.shape[0], 1 + obs.shape[1]), np.int64)
        ids[:, 1:] = n_sp + obs
    ids[:, 0] = BOS_ID
    return ids


def sample_batch(spec: Mapping, n: int, rng: np.random.Generator, *, exact: bool = True,
                 hmm_params: tuple | None = None) -> dict[str, np.ndarray]:
    """Draw ``n`` full sequences as token ids, with the exact answers at every query position.

    Args:
        spec: a task spec; n: batch size; rng: the stream's Generator (see :func:`stream_rng`).
        exact: also compute the exact posteriors (skip for training batches: cheaper).
        hmm_params: ``(initial, transition, emission)`` to avoid recomputing them (hmm only).

    Returns:
        ``{"ids": int64 [n, S]`` (S = :func:`sequence_length`, ``<bos>`` first),
        ``"positions": int64 [P]`` (:func:`query_positions`), ``"targets": int64 [n, P]`` (the
        token id that follows each query position), and with ``exact``:
        ``"posterior": float64 [n, P, A]`` over the answer symbols (:func:`answer_token_ids` order),
        ``"h_exact_bits": float64 [n, P]``}.
    """
    s = _checked(spec)
    if s["kind"] == "bijection":
        sample = sample_bijection(s["V"], s["n_pairs"], n, rng)
    else:
        params = hmm_params if hmm_params is not None else hmm_parameters(s)
        sample = sample_hmm(*params, s["length"], n, rng)[1]
    ids = _encode(s, sample)
    pos = query_positions(s)
    out = {"ids": ids, "positions": pos, "targets": ids[:, pos + 1]}
    if exact:
        if s["kind"] == "bijection":
            V, P = s["V"], s["n_pairs"]
            ys = sample[1]
            used = np.zeros((n, P, V), bool)
            for t in range(1, P):
                used[:, t] = used[:, t - 1]
                used[np.arange(n), t, ys[:, t - 1]] = True
            free = ~used
            out["posterior"] = free / free.sum(-1, keepdims=True)
            out["h_exact_bits"] = np.broadcast_to(bijection_entropy_bits(V, np.arange(P)), (n, P)).copy()
        else:
            fw = hmm_forward(sample, *params)
            out["posterior"] = fw["predictive"][:, :-1]
            out["h_exact_bits"] = fw["predictive_bits"][:, :-1]
    return out


# --------------------------------------------------------------------------------------------
# Prompt sets with exact answers
# --------------------------------------------------------------------------------------------


def prompt_records(spec: Mapping, *, n_sequences: int, cut_positions: Sequence[int], seed: int,
                   name: str | None = None) -> list[dict]:
    """Held-out prompts cut where the model must predict an answer, with the exact posterior (Paper I).

    ``n_sequences`` sequences are drawn from :func:`stream_rng` ``(seed, STREAM_PROMPTS)`` (independent
    of the training and validation streams, see the module docstring); each is cut at every t in
    ``cut_positions``: bijection, t pairs shown and the prompt ends with x_t (t = 0..n_pairs-1);
    hmm, t observations shown and the prompt ends with o_t (t = 1..length-1).

    Returns:
        records ``{"id": "<name>-s<i:04d>-t<t:02d>", "text": str, "meta": {...}}`` in sequence-major
        order, valid for :func:`llmgeom.prompts.io.write_prompt_set`. ``meta``: ``task`` (name), ``kind``,
        ``t``, ``sequence`` (i), ``seed``, ``h_exact_bits`` (exact posterior entropy, bits),
        ``posterior`` (list of floats over the answer symbols, summing to 1), ``candidate_token_ids``
        (token ids of the answer symbols, same order as ``posterior``), ``candidate_tokens``,
        ``answer_token_id`` (the token that actually follows), ``n_tokens`` (prompt tokens incl. ``<bos>``);
        bijection also ``n_unused`` (V - t); hmm also ``state_posterior`` (p(s_t | o_1..t), list [K])
        and ``h_state_bits``.

    Raises:
        ValueError: invalid spec, n_sequences < 1, empty ``cut_positions`` or a cut out of range.
    """
    s = _checked(spec)
    name = name or (spec.get("name") if isinstance(spec, Mapping) else None) or s["kind"]
    if isinstance(n_sequences, bool) or not isinstance(n_sequences, (int, np.integer)) or n_sequences < 1:
        raise ValueError(f"n_sequences = {n_sequences!r}: must be an integer >= 1")
    cuts = [int(t) for t in cut_positions]
    lo, hi = (0, s["n_pairs"] - 1) if s["kind"] == "bijection" else (1, s["length"] - 1)
    if not cuts or any(not lo <= t <= hi for t in cuts) or len(set(cuts)) != len(cuts):
        raise ValueError(f"cut_positions = {list(cut_positions)!r}: must be distinct integers in {lo}..{hi} "
                         f"for this {s['kind']} task")
    rng = stream_rng(seed, STREAM_PROMPTS)
    params = hmm_parameters(s) if s["kind"] == "hmm" else None
    batch = sample_batch(s, int(n_sequences), rng, hmm_params=params)
    cand = answer_token_ids(s)
    vocab = vocabulary(s)
    fw = None
    if s["kind"] == "hmm":
        fw = hmm_forward(batch["ids"][:, 1:] - len(SPECIAL_TOKENS), *params)
    records = []
    for i in range(int(n_sequences)):
        ids = batch["ids"][i]
        for t in cuts:
            q = int(batch["positions"][t])  # query position of cut t; the prompt is ids[:q + 1]
            text = " ".join(vocab[j] for j in ids[1:q + 1])
            meta = {"task": name, "kind": s["kind"], "t": t, "sequence": i, "seed": int(seed),
                    "h_exact_bits": float(batch["h_exact_bits"][i, t]),
                    "posterior": [float(p) for p in batch["posterior"][i, t]],
                    CANDIDATES_KEY: list(cand), "candidate_tokens": [vocab[j] for j in cand],
                    "answer_token_id": int(ids[q + 1]), "n_tokens": q + 1}
            if s["kind"] == "bijection":
                meta["n_unused"] = s["V"] - t
            else:
                meta["state_posterior"] = [float(p) for p in fw["filter"][i, t - 1]]
                meta["h_state_bits"] = float(fw["filter_bits"][i, t - 1])
            records.append({"id": f"{name}-s{i:04d}-t{t:02d}", "text": text, "meta": meta})
    return records
