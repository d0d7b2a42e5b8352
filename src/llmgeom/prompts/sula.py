"""SULA: in-context inference over a latent binary label with an exact Bayesian posterior.

Paper III ("Geometric Scaling of Bayesian Inference in LLMs") sec. 4.3 and 5.2; DESIGN.md sec. 3.

Task. A latent label y in {L1, L2} is drawn with a uniform prior. The prompt shows k examples
``"<carrier word>: <label>"``, one per line; each example's label equals y with probability
``alpha`` (config key ``sula.alpha``), independently. Carrier words are drawn from a positive and a negative
word list independently of y and of the labels, so they carry no information. The prompt ends with
a query line ``"<carrier word>:"``; the next token is the label (with the leading space that the
format ``": "`` implies, ``label_prefix``). Labels are nonsense words that are a single token for the
tokenizer in use, so a prompt set is built per model.

Exact posterior. With counts n_L1, n_L2 among the k examples and r = alpha / (1 - alpha):
``p(y = L1 | data) = 1 / (1 + r^-(n_L1 - n_L2))`` and the posterior predictive of the next label is
p_next(L1) = alpha p + (1 - alpha)(1 - p). Following DESIGN.md, ``H_Bayes`` is the binary entropy (bits)
of the posterior p(y = L1) (1 bit at k = 0, at equal counts, and in the shuffled control).

Model side. log p(" L1") and log p(" L2") over the full vocabulary at the final position (stored
by the extraction as ``next_token/candidate_logprobs``, nats) are renormalized over the two labels:
``p_model(L1) = sigmoid(logp1 - logp2)`` and ``H_model`` = its binary entropy in bits.

Conditions (each its own prompt set, built from the same seeded draws so that they are paired):

* ``main``: the task above, with the first qualifying label pair.
* ``remap``: the same prompts with a different label pair (lexical remap).
* ``shuffled``: the same carrier words, but every example label is drawn uniformly at random,
  independently of y (labels carry no evidence): H_Bayes = 1 bit for every prompt. The alpha-model
  posterior from the counts is kept as ``h_counts_bits`` for reference.
* ``ablation``: the ``main`` prompts with every carrier word (examples and query) replaced by a mask
  string; labels and counts are unchanged, so H_Bayes is unchanged (the model should not need the
  carriers: they carry no information).

Pure functions (no model, no HDF5, no torch). :func:`choose_label_pairs` takes a tokenizer object (any
callable ``tok(text, add_special_tokens=False)["input_ids"]``, e.g. from
:func:`llmgeom.models.loading.load_tokenizer`), so this module imports no model code; the tables are in
:mod:`llmgeom.analyses.sula`.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from llmgeom.measures.bayes import (
    bayes_posterior,
    binary_entropy_bits,
    check_alpha,
    h_bayes_bits,
    posterior_predictive,
)
from llmgeom.prompts.io import CANDIDATES_KEY

CONDITIONS = ("main", "remap", "shuffled", "ablation")

# Carrier words: sentiment-laden on purpose (a model might be tempted to use them), but drawn
# independently of the latent label, so they carry no information about it.
POSITIVE_WORDS = (
    "happy", "good", "kind", "bright", "warm", "calm", "brave", "gentle", "joyful", "lovely",
    "cheerful", "honest", "friendly", "proud", "hopeful", "sweet", "clever", "lucky", "peaceful",
    "generous", "graceful", "healthy", "pleasant", "glad", "noble", "fresh", "smart", "loyal",
    "patient", "wise",
)
NEGATIVE_WORDS = (
    "sad", "bad", "cruel", "dark", "cold", "angry", "afraid", "harsh", "gloomy", "awful",
    "bitter", "dishonest", "hostile", "ashamed", "hopeless", "sour", "foolish", "unlucky", "violent",
    "greedy", "clumsy", "sick", "unpleasant", "upset", "mean", "stale", "dull", "fickle",
    "rude", "lazy",
)
# Nonsense label pairs in order of preference. Per model, the first pair whose two words are each a
# single token (with the label prefix) is used for ``main``, the next qualifying disjoint pair for ``remap``.
LABEL_PAIRS = (
    ("pim", "dop"), ("bif", "wob"), ("gib", "tul"), ("kel", "nud"), ("vap", "sut"), ("bip", "gir"),
    ("mim", "lik"), ("fif", "pir"), ("dax", "wug"), ("blicket", "toma"), ("fep", "zup"),
    ("kiki", "bouba"), ("tib", "kib"),
)


class LabelTokenError(ValueError):
    """No (or not enough) label pairs are single tokens for a tokenizer; the message lists what was tried."""


# --------------------------------------------------------------------------- labels and tokenizer


def single_token_id(tok, word: str, prefix: str = " ") -> int | None:
    """Token id of ``prefix + word`` if it is exactly one token for ``tok`` (no special tokens), else None."""
    ids = tok(prefix + word, add_special_tokens=False)["input_ids"]
    return int(ids[0]) if len(ids) == 1 else None


def _in_context_ok(tok, word_id: int, word: str, prefix: str) -> bool:
    """The label is also that single token inside the prompt format (after "<carrier>:")."""
    for ctx in ("happy:", "sad: x\nkind:"):
        a = tok(ctx, add_special_tokens=False)["input_ids"]
        b = tok(ctx + prefix + word, add_special_tokens=False)["input_ids"]
        if b != a + [word_id]:
            return False
    return True


def choose_label_pairs(tok, n_pairs: int = 2, pairs: Iterable[Sequence[str]] | None = None,
                       prefix: str = " ") -> list[dict]:
    """The first ``n_pairs`` disjoint label pairs whose words are each one token for ``tok``.

    A word qualifies when ``prefix + word`` tokenizes to exactly one token, and appending it to a prompt
    line ending in ":" appends exactly that token (so it is the model's next token).

    Args:
        tok: a Hugging Face tokenizer.
        n_pairs: how many pairs are needed (2: main and remap).
        pairs: candidate pairs in order of preference (default :data:`LABEL_PAIRS`).
        prefix: text between ":" and the label (default one space: the label's token carries it).

    Returns:
        list of dicts {"labels": [w1, w2], "token_ids": [id1, id2]}.

    Raises:
        LabelTokenError: fewer than ``n_pairs`` pairs qualify; lists every pair tried and why.
    """
    pairs = [tuple(p) for p in (pairs if pairs is not None else LABEL_PAIRS)]
    chosen, used, notes = [], set(), []
    for p in pairs:
        if len(p) != 2 or p[0] == p[1]:
            raise ValueError(f"a label pair needs two different words, got {p!r}")
        ids = [single_token_id(tok, w, prefix) for w in p]
        bad = [w for w, i in zip(p, ids) if i is None or not _in_context_ok(tok, i, w, prefix)]
        if bad:
            notes.append(f"{p[0]}/{p[1]} ({', '.join(repr(prefix + w) for w in bad)} not a single token)")
            continue
        if set(p) & used or ids[0] == ids[1]:
            notes.append(f"{p[0]}/{p[1]} (overlaps a chosen pair)")
            continue
        chosen.append({"labels": list(p), "token_ids": [int(i) for i in ids]})
        used |= set(p)
        if len(chosen) == n_pairs:
            return chosen
    name = getattr(tok, "name_or_path", type(tok).__name__)
    raise LabelTokenError(
        f"SULA needs {n_pairs} label pair(s) whose words are single tokens (with prefix {prefix!r}) for "
        f"tokenizer {name!r}, found {len(chosen)}; tried: {'; '.join(notes) or 'no pairs'}. "
        "Add pairs of short nonsense words to sula.label_pairs in the config.")


# --------------------------------------------------------------------------- prompt generation


def format_prompt(carriers: Sequence[str], labels: Sequence[str], query: str, prefix: str = " ") -> str:
    """``"w1: L\\nw2: L\\n...\\nquery:"`` (prefix between ":" and each label)."""
    lines = [f"{w}:{prefix}{lab}" for w, lab in zip(carriers, labels)]
    return "\n".join(lines + [f"{query}:"])


def _draw(seed: int, k: int, i: int, alpha: float) -> dict:
    """Seeded draws for prompt i at k: shared by all conditions (so they are paired)."""
    rng = np.random.default_rng([int(seed), int(k), int(i)])
    y = int(rng.integers(2))  # 0 = L1, 1 = L2
    agree = rng.random(k) < alpha
    ex = np.where(agree, y, 1 - y).astype(int)
    words = [(w, "positive") for w in POSITIVE_WORDS] + [(w, "negative") for w in NEGATIVE_WORDS]
    pick = rng.choice(len(words), size=k + 1, replace=False)
    shuffled = rng.integers(2, size=k).astype(int)  # labels independent of y (shuffled control)
    return {"y": y, "examples": ex.tolist(), "carriers": [words[j][0] for j in pick[:k]],
            "query": words[pick[k]][0], "query_sentiment": words[pick[k]][1],
            "carrier_sentiments": [words[j][1] for j in pick[:k]], "shuffled": shuffled.tolist()}


def generate_sula(pairs: Sequence[dict], *, ks: Sequence[int], n_per_k: int, n_per_k_controls: int | None,
                  alpha: float, seed: int, mask: str, label_prefix: str,
                  conditions: Sequence[str]) -> dict[str, list[dict]]:
    """Build the SULA prompt sets (main and controls) for one tokenizer's label pairs.

    Args:
        pairs: from :func:`choose_label_pairs`; pairs[0] is used by main, shuffled and ablation,
            pairs[1] by remap (needed only when "remap" is in ``conditions``).
        ks: numbers of in-context examples (each >= 0).
        n_per_k: prompts per k for ``main``; ``n_per_k_controls`` (None: the same) for the controls,
            which use the first ``n_per_k_controls`` draws of each k (a paired subset of main).
        alpha: example-label reliability in [0.5, 1).
        seed: prompt i at k uses ``numpy.random.default_rng([seed, k, i])``; changing n_per_k keeps
            the earlier prompts unchanged.
        mask: string replacing every carrier word in the ablation control.
        label_prefix: text between ":" and the label.
        conditions: the conditions built (``main`` and any of :data:`CONDITIONS`).
        (The workflow passes the config section ``sula``; notebooks: ``llmgeom.defaults("sula", generate_sula)``.)

    Returns:
        condition -> list of records {"id", "text", "meta"}; meta has condition, k, i, y ("L1"/"L2", None
        for shuffled), n_L1, n_L2, labels [w1, w2], candidate_token_ids [id1, id2], label_prefix, alpha,
        p_bayes (= p(y = L1)), h_bayes_bits, p_pred / h_pred_bits (posterior predictive of the next label and
        its entropy, :func:`posterior_predictive`), h_counts_bits (alpha-model entropy from the counts, = h_bayes_bits
        except in the shuffled control), query_word, query_sentiment, example_labels (0 = L1, 1 = L2), seed.

    Raises:
        ValueError: bad ks / n / alpha / condition names, or too few pairs for the conditions.

    Source: Paper III sec. 4.3 / 5.2 (SULA and its controls); DESIGN.md sec. 3.
    """
    alpha = check_alpha(alpha)
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown or "main" not in conditions:
        raise ValueError(f"conditions must include 'main' and be among {CONDITIONS}, got {list(conditions)}")
    if any(int(k) != k or k < 0 for k in ks) or not ks:
        raise ValueError(f"ks must be non-negative integers, got {list(ks)}")
    if n_per_k < 1:
        raise ValueError(f"n_per_k must be >= 1, got {n_per_k}")
    n_ctl = n_per_k if n_per_k_controls is None else int(n_per_k_controls)
    if not 1 <= n_ctl:
        raise ValueError(f"n_per_k_controls must be >= 1, got {n_per_k_controls}")
    need = 2 if "remap" in conditions else 1
    if len(pairs) < need:
        raise ValueError(f"conditions {list(conditions)} need {need} label pairs, got {len(pairs)}")
    n_words = len(POSITIVE_WORDS) + len(NEGATIVE_WORDS)
    if max(ks) + 1 > n_words:
        raise ValueError(f"k <= {n_words - 1} (distinct carrier words per prompt), got {max(ks)}")

    out: dict[str, list[dict]] = {c: [] for c in conditions}
    for k in sorted({int(k) for k in ks}):
        for i in range(max(n_per_k, n_ctl)):
            d = _draw(seed, k, i, alpha)
            for cond in conditions:
                if i >= (n_per_k if cond == "main" else n_ctl):
                    continue
                pair = pairs[1] if cond == "remap" else pairs[0]
                ex = d["shuffled"] if cond == "shuffled" else d["examples"]
                n1 = int(sum(1 for e in ex if e == 0))
                n2 = k - n1
                carriers = [mask] * k if cond == "ablation" else d["carriers"]
                query = mask if cond == "ablation" else d["query"]
                text = format_prompt(carriers, [pair["labels"][e] for e in ex], query, label_prefix)
                h_counts = float(h_bayes_bits(n1, n2, alpha=alpha))
                if cond == "shuffled":
                    p, h, y = 0.5, 1.0, None
                else:
                    p = float(bayes_posterior(n1, n2, alpha=alpha))
                    h, y = h_counts, ("L1", "L2")[d["y"]]
                p_pred = float(posterior_predictive(p, alpha=alpha))
                out[cond].append({
                    "id": f"sula-{cond}-k{k}-{i:03d}",
                    "text": text,
                    "meta": {"condition": cond, "k": k, "i": i, "y": y, "n_L1": n1, "n_L2": n2,
                             "labels": list(pair["labels"]), CANDIDATES_KEY: list(pair["token_ids"]),
                             "label_prefix": label_prefix, "alpha": alpha, "p_bayes": p, "h_bayes_bits": h,
                             "p_pred": p_pred, "h_pred_bits": float(binary_entropy_bits(p_pred)),
                             "h_counts_bits": h_counts, "query_word": query,
                             "query_sentiment": None if cond == "ablation" else d["query_sentiment"],
                             "example_labels": list(ex), "seed": seed, "task": "sula"},
                })
    return out


def build_sula_sets(tok, *, label_pairs, ks: Sequence[int], n_per_k: int, n_per_k_controls: int | None, alpha: float,
                    seed: int, mask: str, label_prefix: str,
                    conditions: Sequence[str]) -> tuple[dict[str, list[dict]], list[dict]]:
    """:func:`choose_label_pairs` for ``tok`` (``label_pairs``: candidate pairs, None: the built-in list) then
    :func:`generate_sula` with the other arguments (the keys of the config section ``sula``); returns
    (sets, pairs used).

    Raises:
        LabelTokenError: not enough single-token label pairs for this tokenizer.
    """
    pairs = choose_label_pairs(tok, 2 if "remap" in conditions else 1, label_pairs, label_prefix)
    return generate_sula(pairs, ks=ks, n_per_k=n_per_k, n_per_k_controls=n_per_k_controls, alpha=alpha, seed=seed,
                         mask=mask, label_prefix=label_prefix, conditions=conditions), pairs
