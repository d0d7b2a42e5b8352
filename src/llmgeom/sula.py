"""SULA: in-context inference over a latent binary label with an exact Bayesian posterior.

Paper III ("Geometric Scaling of Bayesian Inference in LLMs") sec. 4.3 and 5.2; DESIGN.md sec. 3.

Task. A latent label y in {L1, L2} is drawn with a uniform prior. The prompt shows k examples
``"<carrier word>: <label>"``, one per line; each example's label equals y with probability
``alpha`` (default 0.9), independently. Carrier words are drawn from a positive and a negative
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

Pure functions on arrays (no model, no HDF5) except :func:`choose_label_pairs`, which takes a tokenizer,
and the table functions, which read the HDF5 store.
"""

from __future__ import annotations

import json
from typing import Iterable, Sequence

import numpy as np

CONDITIONS = ("main", "remap", "shuffled", "ablation")
DEFAULT_KS = (0, 1, 2, 4, 8)
DEFAULT_MASK = "[MASK]"
CANDIDATES_KEY = "label_token_ids"

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

LN2 = float(np.log(2.0))


class LabelTokenError(ValueError):
    """No (or not enough) label pairs are single tokens for a tokenizer; the message lists what was tried."""


# --------------------------------------------------------------------------- exact posterior


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.5 <= alpha < 1.0:
        raise ValueError(f"alpha must be in [0.5, 1), got {alpha!r}")
    return alpha


def binary_entropy_from_logit(z) -> np.ndarray:
    """Binary entropy in bits of p = sigmoid(z), computed stably from the logit z = log(p / (1-p)).

    Args:
        z: array-like of logits (any shape; +-inf allowed and give 0 bits).

    Returns:
        float64 array of the same shape, in [0, 1] bits (1 bit at z = 0).

    Source: Paper III sec. 4.3 (binary entropy of the posterior / of the renormalized label distribution).
    """
    z = np.asarray(z, dtype=np.float64)
    shape = z.shape
    z = np.atleast_1d(z)
    p = _sigmoid(z)
    # -log p = softplus(-z), -log(1-p) = softplus(z); 0 * inf -> 0 handled by where
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.where(p > 0, p * np.logaddexp(0.0, -z), 0.0)
        b = np.where(p < 1, (1.0 - p) * np.logaddexp(0.0, z), 0.0)
    return np.clip((a + b) / LN2, 0.0, 1.0).reshape(shape)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def binary_entropy_bits(p) -> np.ndarray:
    """Binary entropy H(p) = -p log2 p - (1-p) log2 (1-p) in bits, with 0 log 0 = 0.

    Args:
        p: array-like of probabilities in [0, 1].

    Raises:
        ValueError: a value outside [0, 1] or non-finite.
    """
    p = np.asarray(p, dtype=np.float64)
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("probabilities must be finite and in [0, 1]")
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -(np.where(p > 0, p * np.log2(p), 0.0) + np.where(p < 1, (1 - p) * np.log2(1 - p), 0.0))
    return np.clip(h, 0.0, 1.0)


def posterior_logit(n_l1, n_l2, alpha: float = 0.9) -> np.ndarray:
    """Log posterior odds log p(L1)/p(L2) = (n_L1 - n_L2) log(alpha / (1 - alpha)) (uniform prior), nats.

    Raises:
        ValueError: alpha outside [0.5, 1) or negative counts.
    """
    alpha = _check_alpha(alpha)
    n1, n2 = np.asarray(n_l1, dtype=np.float64), np.asarray(n_l2, dtype=np.float64)
    if np.any(n1 < 0) or np.any(n2 < 0):
        raise ValueError("counts must be non-negative")
    return (n1 - n2) * np.log(alpha / (1.0 - alpha))


def bayes_posterior(n_l1, n_l2, alpha: float = 0.9) -> np.ndarray:
    """Exact posterior p(y = L1 | examples) = 1 / (1 + (alpha/(1-alpha))^-(n_L1 - n_L2)).

    Args:
        n_l1, n_l2: counts of examples labelled L1 / L2 (array-like, broadcastable).
        alpha: probability that an example's label equals the latent label, in [0.5, 1).
            alpha = 0.5 means labels carry no evidence (p = 0.5 for any counts).

    Returns:
        float64 array p(L1) in [0, 1]; k = 0 or equal counts give 0.5; all k examples agreeing on L1
        give 1 / (1 + 9^-k) at alpha = 0.9.

    Source: Paper III sec. 4.3; DESIGN.md sec. 3 (SULA).
    """
    z = posterior_logit(n_l1, n_l2, alpha)
    return _sigmoid(np.atleast_1d(z)).reshape(np.shape(z))


def h_bayes_bits(n_l1, n_l2, alpha: float = 0.9) -> np.ndarray:
    """Binary entropy (bits) of the exact posterior :func:`bayes_posterior`; 1 bit at k = 0 or equal counts.

    Source: Paper III sec. 4.3 ("H_Bayes").
    """
    z = posterior_logit(n_l1, n_l2, alpha)
    return binary_entropy_from_logit(np.atleast_1d(z)).reshape(np.shape(z))


def posterior_predictive(p_l1, alpha: float = 0.9) -> np.ndarray:
    """Probability that the NEXT example's label is L1: alpha p + (1 - alpha)(1 - p), p = p(y = L1 | data).

    Its binary entropy is >= H(alpha) (0.469 bits at alpha = 0.9) however many examples are seen; the
    headline comparison (DESIGN.md, Paper III) uses the posterior entropy H_Bayes instead, and this one is
    reported alongside (``h_pred_bits``).
    """
    alpha = _check_alpha(alpha)
    p = np.asarray(p_l1, np.float64)
    return alpha * p + (1.0 - alpha) * (1.0 - p)


def model_label_entropy(logp_l1, logp_l2) -> tuple[np.ndarray, np.ndarray]:
    """Renormalize the model's next-token probabilities over the two labels.

    Args:
        logp_l1, logp_l2: log-probabilities (nats, over the full vocabulary) of the two label tokens
            at the final position, arrays [n].

    Returns:
        (p_model(L1) [n] = sigmoid(logp1 - logp2), H_model [n] in bits).

    Raises:
        ValueError: non-finite log-probabilities.

    Source: Paper III sec. 4.3 ("H_model").
    """
    a, b = np.asarray(logp_l1, np.float64), np.asarray(logp_l2, np.float64)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("label log-probabilities must be finite")
    z = np.atleast_1d(a - b)
    return _sigmoid(z).reshape(np.shape(a - b)), binary_entropy_from_logit(z).reshape(np.shape(a - b))


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


def generate_sula(pairs: Sequence[dict], *, ks: Sequence[int] = DEFAULT_KS, n_per_k: int = 50,
                  n_per_k_controls: int | None = None, alpha: float = 0.9, seed: int = 0,
                  mask: str = DEFAULT_MASK, prefix: str = " ",
                  conditions: Sequence[str] = CONDITIONS) -> dict[str, list[dict]]:
    """Build the SULA prompt sets (main and controls) for one tokenizer's label pairs.

    Args:
        pairs: from :func:`choose_label_pairs`; pairs[0] is used by main, shuffled and ablation,
            pairs[1] by remap (needed only when "remap" is in ``conditions``).
        ks: numbers of in-context examples (each >= 0).
        n_per_k: prompts per k for ``main``; ``n_per_k_controls`` (default: the same) for the controls,
            which use the first ``n_per_k_controls`` draws of each k (a paired subset of main).
        alpha: example-label reliability in [0.5, 1).
        seed: prompt i at k uses ``numpy.random.default_rng([seed, k, i])``; changing n_per_k keeps
            the earlier prompts unchanged.
        mask: string replacing every carrier word in the ablation control.
        prefix: text between ":" and the label.

    Returns:
        condition -> list of records {"id", "text", "meta"}; meta has condition, k, i, y ("L1"/"L2", None
        for shuffled), n_L1, n_L2, labels [w1, w2], label_token_ids [id1, id2], label_prefix, alpha,
        p_bayes (= p(y = L1)), h_bayes_bits, p_pred / h_pred_bits (posterior predictive of the next label and
        its entropy, :func:`posterior_predictive`), h_counts_bits (alpha-model entropy from the counts, = h_bayes_bits
        except in the shuffled control), query_word, query_sentiment, example_labels (0 = L1, 1 = L2), seed.

    Raises:
        ValueError: bad ks / n / alpha / condition names, or too few pairs for the conditions.

    Source: Paper III sec. 4.3 / 5.2 (SULA and its controls); DESIGN.md sec. 3.
    """
    alpha = _check_alpha(alpha)
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
                text = format_prompt(carriers, [pair["labels"][e] for e in ex], query, prefix)
                h_counts = float(h_bayes_bits(n1, n2, alpha))
                if cond == "shuffled":
                    p, h, y = 0.5, 1.0, None
                else:
                    p = float(bayes_posterior(n1, n2, alpha))
                    h, y = h_counts, ("L1", "L2")[d["y"]]
                p_pred = float(posterior_predictive(p, alpha))
                out[cond].append({
                    "id": f"sula-{cond}-k{k}-{i:03d}",
                    "text": text,
                    "meta": {"condition": cond, "k": k, "i": i, "y": y, "n_L1": n1, "n_L2": n2,
                             "labels": list(pair["labels"]), CANDIDATES_KEY: list(pair["token_ids"]),
                             "label_prefix": prefix, "alpha": alpha, "p_bayes": p, "h_bayes_bits": h,
                             "p_pred": p_pred, "h_pred_bits": float(binary_entropy_bits(p_pred)),
                             "h_counts_bits": h_counts, "query_word": query,
                             "query_sentiment": None if cond == "ablation" else d["query_sentiment"],
                             "example_labels": list(ex), "seed": seed, "task": "sula"},
                })
    return out


def load_tokenizer(model_dir):
    """The tokenizer of a prepared model directory (follows ``weights_path`` in its manifest)."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from .models import read_manifest

    wp = Path(read_manifest(model_dir).get("weights_path") or ".")
    return AutoTokenizer.from_pretrained(wp if wp.is_absolute() else Path(model_dir) / wp)


def build_sula_sets(tok, *, label_pairs=None, **kw) -> tuple[dict[str, list[dict]], list[dict]]:
    """:func:`choose_label_pairs` for ``tok`` then :func:`generate_sula`; returns (sets, pairs used).

    Raises:
        LabelTokenError: not enough single-token label pairs for this tokenizer.
    """
    conditions = kw.get("conditions", CONDITIONS)
    prefix = kw.get("prefix", " ")
    pairs = choose_label_pairs(tok, 2 if "remap" in conditions else 1, label_pairs, prefix)
    return generate_sula(pairs, **kw), pairs


# --------------------------------------------------------------------------- tables (read the HDF5 store)


def _pearson(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Pearson r and two-sided p; (NaN, NaN) if fewer than 3 points or either input is constant."""
    from scipy import stats

    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan"), float("nan")
    r = stats.pearsonr(x, y)
    return float(r.statistic), float(r.pvalue)


def _spearman(x, y) -> tuple[float, float]:
    from .geometry import _spearman as sp

    if len(x) < 3:
        return float("nan"), float("nan")
    return sp(np.asarray(x, np.float64), np.asarray(y, np.float64))


def read_sula_h5(path, *, model: str | None = None):
    """Per-prompt SULA quantities from one activation file written with candidate log-probs.

    Returns:
        (pandas DataFrame with one row per prompt: id-free columns condition, k, i, n_L1, n_L2, labels,
        alpha, p_bayes, h_bayes_bits, h_counts_bits, h_pred_bits, logp_l1, logp_l2 (nats), p_model, h_model_bits,
        label_mass (p(L1) + p(L2) over the full vocabulary), h_vocab_bits (full next-token entropy, bits);
        values h5 dataset is not loaded).

    Raises:
        StoreError: untrusted file; KeyError: the file has no ``next_token/candidate_logprobs`` (it was
        not extracted as a SULA set: rerun rule extract_sula).
    """
    import pandas as pd

    from .store import open_activations

    with open_activations(path, model=model) as f:
        if "next_token/candidate_logprobs" not in f:
            raise KeyError(f"{path} has no next_token/candidate_logprobs; it is not a SULA extraction "
                           "(rerun rule extract_sula)")
        meta = [json.loads(m) for m in f["prompts/meta"].asstr()[:]]
        lp = f["next_token/candidate_logprobs"][:].astype(np.float64)
        hv = f["next_token/entropy"][:].astype(np.float64) / LN2
    p_model, h_model = model_label_entropy(lp[:, 0], lp[:, 1])
    df = pd.DataFrame({
        "condition": [m["condition"] for m in meta], "k": [int(m["k"]) for m in meta],
        "i": [int(m["i"]) for m in meta], "n_L1": [m["n_L1"] for m in meta], "n_L2": [m["n_L2"] for m in meta],
        "labels": ["/".join(m["labels"]) for m in meta], "alpha": [m["alpha"] for m in meta],
        "p_bayes": [m["p_bayes"] for m in meta], "h_bayes_bits": [m["h_bayes_bits"] for m in meta],
        "h_counts_bits": [m["h_counts_bits"] for m in meta],
        "h_pred_bits": [m.get("h_pred_bits", np.nan) for m in meta],
        "logp_l1": lp[:, 0], "logp_l2": lp[:, 1], "p_model": p_model, "h_model_bits": h_model,
        "label_mass": np.exp(lp[:, 0]) + np.exp(lp[:, 1]), "h_vocab_bits": hv,
    })
    return df


def sula_stats(h_model, h_bayes, p_model=None, p_bayes=None) -> dict:
    """MAE |H_model - H_Bayes| (bits) and Pearson r between them (NaN when either is constant, e.g.
    at k = 0 or in the shuffled control, where H_Bayes = 1 bit for every prompt).

    Source: Paper III sec. 5.2 (SULA calibration: MAE and r).
    """
    hm, hb = np.asarray(h_model, np.float64), np.asarray(h_bayes, np.float64)
    r, p = _pearson(hm, hb)
    out = {"n": int(hm.size), "mae_bits": float(np.mean(np.abs(hm - hb))) if hm.size else float("nan"),
           "pearson_r": r, "pearson_p": p, "mean_h_model_bits": float(np.mean(hm)) if hm.size else float("nan"),
           "mean_h_bayes_bits": float(np.mean(hb)) if hb.size else float("nan")}
    if p_model is not None and p_bayes is not None:
        out["mae_p"] = float(np.mean(np.abs(np.asarray(p_model) - np.asarray(p_bayes))))
    return out


def sula_table(per_prompt, *, model: str):
    """Per condition, per k and overall (k = "all"): n, mae_bits, pearson_r, pearson_p, mean_h_model_bits,
    mean_h_bayes_bits, mae_p (|p_model(L1) - p_bayes(L1)|), mean_h_pred_bits / mae_pred_bits (against the
    posterior predictive entropy), mean_label_mass, mean_h_vocab_bits, labels, alpha.

    Args:
        per_prompt: DataFrame from :func:`read_sula_h5` (all conditions concatenated).

    Source: Paper III sec. 5.2.
    """
    import pandas as pd

    rows = []
    for cond, g in per_prompt.groupby("condition", sort=False):
        groups = [(str(k), gk) for k, gk in g.groupby("k")] + [("all", g)]
        for k, gk in groups:
            st = sula_stats(gk.h_model_bits, gk.h_bayes_bits, gk.p_model, gk.p_bayes)
            rows.append(dict(model=model, condition=cond, labels=gk.labels.iloc[0], k=k, **st,
                             mean_h_pred_bits=float(gk.h_pred_bits.mean()),
                             mae_pred_bits=float(np.mean(np.abs(gk.h_model_bits - gk.h_pred_bits))),
                             mean_label_mass=float(gk.label_mass.mean()),
                             mean_h_vocab_bits=float(gk.h_vocab_bits.mean()), alpha=float(gk.alpha.iloc[0])))
    return pd.DataFrame(rows)


def calibration_table(per_prompt, *, model: str, n_bins: int = 10):
    """Calibration: prompts binned by H_Bayes (equal-width bins on [0, 1] bit, last bin closed), per
    condition: bin, bin_lo, bin_hi, n, mean_h_bayes_bits, mean_h_model_bits, sd_h_model_bits,
    mean_abs_error_bits. Empty bins are omitted. A calibrated model has mean_h_model ~ mean_h_bayes.

    Source: Paper III sec. 5.2 (calibration of H_model against H_Bayes).
    """
    import pandas as pd

    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    rows = []
    for cond, g in per_prompt.groupby("condition", sort=False):
        hb = g.h_bayes_bits.to_numpy(np.float64)
        hm = g.h_model_bits.to_numpy(np.float64)
        b = np.clip(np.searchsorted(edges, hb, side="right") - 1, 0, n_bins - 1)
        for j in range(n_bins):
            sel = b == j
            if not sel.any():
                continue
            rows.append(dict(model=model, condition=cond, bin=j, bin_lo=edges[j], bin_hi=edges[j + 1],
                             n=int(sel.sum()), mean_h_bayes_bits=float(hb[sel].mean()),
                             mean_h_model_bits=float(hm[sel].mean()),
                             sd_h_model_bits=float(hm[sel].std(ddof=1)) if sel.sum() > 1 else float("nan"),
                             mean_abs_error_bits=float(np.abs(hm[sel] - hb[sel]).mean())))
    return pd.DataFrame(rows)


def pc1_scores(X, reference) -> tuple[np.ndarray, float, bool]:
    """PC1 score of standardized rows X [n, d] with the sign fixed so that Pearson corr(score, reference)
    >= 0 (the interventions' convention: reference = H_model); returns (score [n], explained-variance
    fraction of PC1, flipped). Constant reference -> no flip.

    Source: Paper III sec. 4.3/4.5 (PC1 of last-token values; entropy axis sign).
    """
    from .geometry import _fit_pca, standardize_columns

    Z, _ = standardize_columns(X, True)
    pca = _fit_pca(Z, 1)
    s = np.asarray(pca.transform(Z)[:, 0], np.float64)
    r, _ = _pearson(s, np.asarray(reference, np.float64))
    flipped = bool(np.isfinite(r) and r < 0)
    return (-s if flipped else s), float(pca.explained_variance_ratio_[0]), flipped


def geometry_table(h5_paths: dict, per_prompt, *, model: str, layers="all"):
    """SULA geometry per condition and layer: PC1 of the standardized last-token values
    (``last_token/values`` [n, L, n_kv*head_dim]); its sign is fixed so that Pearson corr(PC1, H_model) >= 0.

    Returns:
        (table, scores) where table has model, condition, layer, relative_depth ((layer+1)/L), n, pc1_var
        (explained-variance fraction), rho_pc1_h_bayes / p (Spearman, PC1 vs H_Bayes; NaN if H_Bayes is
        constant, e.g. shuffled), rho_k_pc1 / p (Spearman, k vs PC1), rho_pc1_h_model / p,
        pc1_sign_flipped (all NaN at a layer where the values do not vary across prompts, e.g. layer 0: the
        final token is always ":"); and scores = {condition: PC1 score [n] at the last layer analysed}.

    Source: Paper III sec. 4.3 (geometry on SULA).
    """
    import pandas as pd

    from .store import open_activations
    from .tables import _layers

    rows, last_scores = [], {}
    for cond, path in h5_paths.items():
        g = per_prompt[per_prompt.condition == cond]
        hb, hm, k = (g[c].to_numpy(np.float64) for c in ("h_bayes_bits", "h_model_bits", "k"))
        with open_activations(path, model=model) as f:
            V = f["last_token/values"]
            L = V.shape[1]
            for layer in _layers(layers, L):
                X = np.asarray(V[:, layer, :], np.float64)
                if not np.any(np.ptp(X, axis=0) > 0):
                    # e.g. layer 0: the value at the final token ":" depends on that token only
                    rows.append(dict(model=model, condition=cond, layer=layer, relative_depth=(layer + 1) / L,
                                     n=len(X), pc1_var=np.nan, rho_pc1_h_bayes=np.nan, p_pc1_h_bayes=np.nan,
                                     rho_k_pc1=np.nan, p_k_pc1=np.nan, rho_pc1_h_model=np.nan, p_pc1_h_model=np.nan,
                                     pc1_sign_flipped=False))
                    last_scores[cond] = np.full(len(X), np.nan)
                    continue
                s, var, flipped = pc1_scores(X, hm)
                r1, p1 = _spearman(s, hb)
                r2, p2 = _spearman(k, s)
                r3, p3 = _spearman(s, hm)
                rows.append(dict(model=model, condition=cond, layer=layer, relative_depth=(layer + 1) / L,
                                 n=len(s), pc1_var=var, rho_pc1_h_bayes=r1, p_pc1_h_bayes=p1, rho_k_pc1=r2,
                                 p_k_pc1=p2, rho_pc1_h_model=r3, p_pc1_h_model=p3, pc1_sign_flipped=flipped))
                last_scores[cond] = s
    return pd.DataFrame(rows), last_scores


def sula_tables(h5_paths: dict, *, model: str, n_bins: int = 10, layers="all") -> dict:
    """All SULA tables for one model: {"sula", "calibration", "geometry", "prompts"} DataFrames.

    Args:
        h5_paths: condition -> ``results/{model}/activations/sula_{condition}.h5``.

    ``prompts`` holds one row per prompt (condition, k, i, counts, p_bayes, h_bayes_bits, p_model,
    h_model_bits, label_mass, h_vocab_bits, logp_l1/l2 in nats) plus ``pc1_last`` (PC1 score of the values at
    the last analysed layer, sign convention of :func:`geometry_table`).

    Source: Paper III sec. 4.3 / 5.2.
    """
    import pandas as pd

    per = pd.concat([read_sula_h5(p, model=model) for p in h5_paths.values()], ignore_index=True)
    geo, scores = geometry_table(h5_paths, per, model=model, layers=layers)
    per["pc1_last"] = np.nan
    for cond, s in scores.items():
        per.loc[per.condition == cond, "pc1_last"] = s
    per.insert(0, "model", model)
    return {"sula": sula_table(per, model=model), "calibration": calibration_table(per, model=model, n_bins=n_bins),
            "geometry": geo, "prompts": per}
