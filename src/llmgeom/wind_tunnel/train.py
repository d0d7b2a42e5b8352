"""Train one wind-tunnel model and save it as a plain Hugging Face directory (torch + transformers).

Source: Paper I ("The Bayesian Geometry of Transformer Attention": small transformers trained on
tasks with exact posteriors, entropy calibration in bits); Paper II ("Gradient Dynamics of
Attention": checkpoints for geometry over training); DESIGN.md section 3, "Wind tunnel".

Training recipe (stated once, recorded in every manifest):

* model: ``transformers`` ``LlamaConfig`` (default) or ``GPT2Config`` from ``arch``; no dropout;
  ``max_position_embeddings`` / ``n_positions`` = the full sequence length (``<bos>`` included);
  initialization by transformers' own ``_init_weights`` after ``torch.manual_seed(seed)``.
* tokenizer: ``tokenizers`` WordLevel over :func:`llmgeom.prompts.wind_tunnel.vocabulary`, whitespace
  split, ``<bos>`` prepended by a TemplateProcessing post-processor, wrapped in
  ``PreTrainedTokenizerFast``; checked (before and after saving) to map prompt text to exactly the
  ids the trainer uses.
* data: fresh sequences at every step from ``tasks.stream_rng(seed, STREAM_TRAIN)``; a fixed
  validation set of ``n_val`` sequences from ``tasks.stream_rng(seed, STREAM_VALID)``.
* loss: mean cross-entropy (nats, over the full vocabulary) of the answer token at the answer
  positions only (``tasks.query_positions``: bijection, the output y_t predicted at x_t; hmm, every
  next observation); other positions carry no loss.
* optimizer: AdamW (betas, weight decay on every parameter), gradient clipping to ``clip_norm``
  (global L2 norm), learning rate linear warm-up from lr/warmup_steps to ``lr`` over ``warmup_steps``
  steps, then cosine decay to ``min_lr_ratio * lr`` at the last step (``schedule="cosine"``) or
  constant (``schedule="constant"``).
* determinism: ``torch.manual_seed(seed)``, ``torch.use_deterministic_algorithms(True)`` and
  ``torch.set_num_threads(threads)`` during training (previous settings restored afterwards); on CPU
  two runs with the same arguments and thread count give bit-identical weights.
* validation (every ``eval_every`` steps and at the end): the model's next-token distribution at each
  answer position, RENORMALIZED over the answer-symbol tokens (as SULA renormalizes over its two
  labels), its entropy in bits vs the exact posterior entropy: MAE in bits; also the mean
  probability mass on the answer symbols (before renormalizing) and the mean KL(exact || model) in bits.

Output layout: ``out_dir`` (model + tokenizer + ``manifest.json`` + ``training_log.csv``); checkpoint
at step k: the sibling ``<out_dir.parent>/<out_dir.name>-step<k>`` (:func:`checkpoint_dir`), a full
HF directory with its own manifest (``checkpoint_of``, ``step``) and the log up to step k. Everything
is written under a temporary ``.<name>.*.partial`` sibling and renamed when complete; checkpoints
are renamed into place before the final directory, so a final directory implies its checkpoints.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from llmgeom.core.io import atomic_dir, commit_dir
from llmgeom.core.units import nats_to_bits
from llmgeom.prompts import wind_tunnel as tasks

__all__ = [
    "FAMILIES",
    "LOG_COLUMNS",
    "MANIFEST",
    "check_arch",
    "build_tokenizer",
    "check_tokenizer",
    "build_config",
    "checkpoint_dir",
    "evaluate",
    "lr_at",
    "train_wind_tunnel",
]

#: Model families the trainer builds.
FAMILIES = ("llama", "gpt2")
#: Columns of ``training_log.csv``.
LOG_COLUMNS = ("step", "loss", "lr", "val_mae_bits", "val_answer_mass", "val_kl_bits", "wall_s")
MANIFEST = "manifest.json"
LOG_FILE = "training_log.csv"
_ARCH_KEYS = {"family", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff"}


# --------------------------------------------------------------------------------------------
# Model and tokenizer
# --------------------------------------------------------------------------------------------


def check_arch(arch: Mapping, where: str = "arch") -> dict:
    """Validate and normalize an architecture dict.

    Args:
        arch: ``{"family": "llama" | "gpt2", "n_layers": int >= 1, "d_model": int,
            "n_heads": int dividing d_model, "n_kv_heads": int dividing n_heads (llama only; default
            n_heads), "d_ff": int (default 4 * d_model)}``.
        where: config path prefix used in messages (e.g. ``wind_tunnel.models.wt_bij.arch``).

    Returns:
        The normalized dict (all keys present).

    Raises:
        ValueError: naming ``<where>.<key>`` and what is valid.
    """
    if not isinstance(arch, Mapping):
        raise ValueError(f"{where}: must be a mapping with n_layers, d_model, n_heads")
    unknown = sorted(set(arch) - _ARCH_KEYS)
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown key; allowed: {', '.join(sorted(_ARCH_KEYS))}")
    out = {"family": arch.get("family")}  # its default lives in the schema (wind_tunnel.models.<name>.arch.family)
    if out["family"] not in FAMILIES:
        raise ValueError(f"{where}.family = {out['family']!r}: must be one of {', '.join(FAMILIES)}")

    def pos_int(key, default=None):
        v = arch.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{where}.{key} = {v!r}: must be an integer >= 1")
        return int(v)

    out["n_layers"], out["d_model"], out["n_heads"] = pos_int("n_layers"), pos_int("d_model"), pos_int("n_heads")
    if out["d_model"] % out["n_heads"]:
        raise ValueError(f"{where}.n_heads = {out['n_heads']}: must divide d_model = {out['d_model']}")
    out["n_kv_heads"] = pos_int("n_kv_heads", out["n_heads"])
    if out["n_heads"] % out["n_kv_heads"]:
        raise ValueError(f"{where}.n_kv_heads = {out['n_kv_heads']}: must divide n_heads = {out['n_heads']}")
    if out["family"] == "gpt2" and out["n_kv_heads"] != out["n_heads"]:
        raise ValueError(f"{where}.n_kv_heads: GPT-2 has no grouped-query attention; drop it or use llama")
    out["d_ff"] = pos_int("d_ff", 4 * out["d_model"])
    return out


def build_tokenizer(spec: Mapping):
    """WordLevel tokenizer over ``tasks.vocabulary(spec)``, whitespace split, ``<bos>`` prepended.

    Returns:
        ``transformers.PreTrainedTokenizerFast`` with pad/bos/eos/unk = ids 0/1/2/3;
        ``tok("x3 y7 x1")["input_ids"] == [1, id(x3), id(y7), id(x1)]``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(tasks.vocabulary(spec))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", tasks.BOS_ID)])
    tk.decoder = decoders.WordPiece(prefix="##")  # joins word tokens with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>",
                                   model_max_length=tasks.sequence_length(spec))


def check_tokenizer(tok, spec: Mapping, n: int = 8, seed: int = 0) -> None:
    """Check that prompt text of ``n`` random sequences (and every prefix) tokenizes to the trainer's ids.

    Raises:
        RuntimeError: a mismatch (text, expected ids, got ids).
    """
    batch = tasks.sample_batch(spec, n, np.random.default_rng(seed), exact=False)
    vocab = tasks.vocabulary(spec)
    for ids in batch["ids"]:
        for q in batch["positions"]:
            want = [int(i) for i in ids[:q + 1]]
            text = " ".join(vocab[i] for i in want[1:])
            got = tok(text, add_special_tokens=True)["input_ids"]
            if list(got) != want:
                raise RuntimeError(f"wind-tunnel tokenizer mismatch on {text!r}: expected {want}, got {list(got)}")


def build_config(spec: Mapping, arch: Mapping):
    """A ``transformers`` config (LlamaConfig or GPT2Config) for the task's vocabulary and sequence length.

    Raises:
        ValueError: invalid ``arch`` (see :func:`check_arch`) or spec.
    """
    a = check_arch(arch)
    V = len(tasks.vocabulary(spec))
    S = tasks.sequence_length(spec)
    common = dict(vocab_size=V, pad_token_id=tasks.PAD_ID, bos_token_id=tasks.BOS_ID, eos_token_id=tasks.EOS_ID)
    if a["family"] == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(hidden_size=a["d_model"], intermediate_size=a["d_ff"], num_hidden_layers=a["n_layers"],
                           num_attention_heads=a["n_heads"], num_key_value_heads=a["n_kv_heads"],
                           max_position_embeddings=S, rms_norm_eps=1e-5, tie_word_embeddings=False,
                           attention_dropout=0.0, initializer_range=0.02, **common)
    from transformers import GPT2Config

    return GPT2Config(n_embd=a["d_model"], n_inner=a["d_ff"], n_layer=a["n_layers"], n_head=a["n_heads"],
                      n_positions=S, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)


def checkpoint_dir(out_dir, step: int) -> Path:
    """Path of the checkpoint at ``step``: the sibling ``<out_dir.parent>/<out_dir.name>-step<step>``."""
    out_dir = Path(out_dir)
    return out_dir.parent / f"{out_dir.name}-step{int(step)}"


def _arch_summary(config) -> dict:
    from llmgeom.models import families

    return families.summarize(config).as_dict()


# --------------------------------------------------------------------------------------------
# Schedule and evaluation
# --------------------------------------------------------------------------------------------


def lr_at(step: int, *, lr: float, steps: int, warmup_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Learning rate used for optimizer step ``step`` (1-based).

    ``schedule`` and ``min_lr_ratio`` are required (schema keys ``wind_tunnel.models.<name>.training.schedule``
    and ``.min_lr_ratio``).

    Linear warm-up ``lr * step / warmup_steps`` for step <= warmup_steps, then ``constant`` (lr) or
    ``cosine``: ``lr * (r + (1 - r) * (1 + cos(pi * u)) / 2)`` with u = (step - warmup) / (steps - warmup)
    and r = ``min_lr_ratio`` (so lr at the last step is r * lr).
    """
    if warmup_steps > 0 and step <= warmup_steps:
        return lr * step / warmup_steps
    if schedule == "constant" or steps <= warmup_steps:
        return lr
    u = (step - warmup_steps) / (steps - warmup_steps)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * u)))


@torch.inference_mode()
def evaluate(model, batch: Mapping, candidates: Sequence[int], chunk: int = 512) -> dict:
    """Calibration of the model against the exact posteriors of ``batch`` (Paper I entropy MAE).

    Args:
        model: causal LM; batch: :func:`tasks.sample_batch` output with ``exact=True``
            (ids [n, S], positions [P], posterior [n, P, A], h_exact_bits [n, P]);
        candidates: the answer-symbol token ids [A] (``tasks.answer_token_ids``).

    Returns:
        ``{"mae_bits": float`` mean |H_model - H_exact| in bits, H_model the entropy of the next-token
        distribution renormalized over ``candidates``; ``"mae_bits_by_t": list [P]``;
        ``"answer_mass": float`` mean probability on the candidates (full softmax);
        ``"kl_bits": float`` mean KL(exact || renormalized model) in bits;
        ``"h_model_bits": ndarray [n, P]``}.
    """
    was_training = model.training
    model.eval()
    ids = torch.as_tensor(batch["ids"])
    pos = torch.as_tensor(batch["positions"])
    cand = torch.as_tensor(list(candidates))
    h_model, mass, kl = [], [], []
    exact = torch.as_tensor(batch["posterior"], dtype=torch.float64)
    for i in range(0, ids.shape[0], chunk):
        logits = model(input_ids=ids[i:i + chunk]).logits[:, pos].double()  # [b, P, vocab]
        full = torch.log_softmax(logits, -1)
        mass.append(full[..., cand].exp().sum(-1))
        lq = torch.log_softmax(logits[..., cand], -1)  # renormalized over the answer symbols
        q = lq.exp()
        h_model.append(nats_to_bits(-(q * lq).sum(-1)))
        p = exact[i:i + chunk]
        kl.append(nats_to_bits(torch.where(p > 0, p * (torch.log(p.clamp_min(1e-300)) - lq), torch.zeros_like(p)).sum(-1)))
    if was_training:
        model.train()
    h = torch.cat(h_model).numpy()
    err = np.abs(h - np.asarray(batch["h_exact_bits"]))
    return {"mae_bits": float(err.mean()), "mae_bits_by_t": [float(x) for x in err.mean(0)],
            "answer_mass": float(torch.cat(mass).mean()), "kl_bits": float(torch.cat(kl).mean()),
            "h_model_bits": h}


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def _save_dir(path: Path, model, tok, manifest: dict, log_rows: list[dict]) -> None:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=LOG_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(log_rows)
    (path / LOG_FILE).write_text(buf.getvalue())
    (path / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))


def train_wind_tunnel(spec: Mapping, out_dir, *, seed: int, steps: int, batch_size: int, lr: float,
                      warmup_steps: int, weight_decay: float, clip_norm: float, arch: Mapping,
                      checkpoints: Sequence[int], threads: int, n_val: int, schedule: str, min_lr_ratio: float,
                      log: Callable[[str], None] = print, name: str | None = None, eval_every: int | None = None,
                      log_every: int | None = None, betas: tuple[float, float] = (0.9, 0.98)) -> dict:
    """Train a small causal transformer on a task with an exact posterior (Paper I; recipe in the module doc).

    Args:
        spec: task spec (:func:`tasks.check_task`); out_dir: final HF directory (``resources/models/{name}``).
        seed: model init (torch) and data streams (numpy, :func:`tasks.stream_rng`).
        steps: optimizer steps; batch_size: sequences per step; lr: peak learning rate;
        warmup_steps: linear warm-up steps; weight_decay: AdamW decoupled weight decay;
        clip_norm: global gradient-norm clip; arch: :func:`check_arch` dict;
        checkpoints: steps (0..steps; 0 = the initialization) at which a full HF directory is also saved (:func:`checkpoint_dir`);
        threads: torch intra-op threads during training; log: called with one line per event;
        name: model name in the manifest (default ``out_dir.name``);
        eval_every: validation interval in steps (default steps // 10; always at the last step);
        log_every: loss/lr log interval (default steps // 20); n_val: validation sequences;
        schedule: "cosine" or "constant" after warm-up; min_lr_ratio: cosine floor; betas: AdamW betas.

    Returns:
        ``{"model_dir": Path, "manifest": dict, "checkpoints": {step: Path}}``.

    Raises:
        ValueError: invalid spec, arch or training settings (message names the argument);
        RuntimeError: the tokenizer does not reproduce the trainer's ids, or a non-finite loss.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec_n = tasks.check_task(name or "<task>", {k: v for k, v in spec.items() if k != "name"})
    arch_n = check_arch(arch)
    out_dir = Path(out_dir)
    name = name or out_dir.name
    ckpts = _check_training(steps=steps, batch_size=batch_size, warmup_steps=warmup_steps, threads=threads,
                            n_val=n_val, lr=lr, clip_norm=clip_norm, weight_decay=weight_decay, schedule=schedule,
                            checkpoints=checkpoints)
    eval_every = int(eval_every or max(1, steps // 10))
    log_every = int(log_every or max(1, steps // 20))
    tmp = atomic_dir(out_dir)
    try:
        with _deterministic(threads, seed):
            tok = build_tokenizer(spec_n)
            check_tokenizer(tok, spec_n)
            config = build_config(spec_n, arch_n)
            model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
            model.train()
            n_params = sum(p.numel() for p in model.parameters())
            training = dict(seed=int(seed), steps=int(steps), batch_size=int(batch_size), lr=float(lr),
                            warmup_steps=int(warmup_steps), weight_decay=float(weight_decay),
                            clip_norm=float(clip_norm), schedule=schedule, min_lr_ratio=float(min_lr_ratio),
                            betas=list(betas), optimizer="AdamW", eval_every=eval_every, log_every=log_every,
                            n_val=int(n_val), threads=int(threads),
                            loss="cross-entropy (nats, full vocabulary) at answer positions only",
                            seeds={"torch_init": int(seed), "train_stream": [int(seed), tasks.STREAM_TRAIN],
                                   "valid_stream": [int(seed), tasks.STREAM_VALID]})
            log(f"wind tunnel {name}: {spec_n['kind']} task, {arch_n['family']} {arch_n['n_layers']}x"
                f"{arch_n['d_model']} ({arch_n['n_heads']} heads), {n_params} parameters, {steps} steps x "
                f"{batch_size}, lr {lr}, seed {seed}")
            ckpt_tmp: dict[int, Path] = {}

            def save_checkpoint(step, ev, wall_s, rows):  # a full HF directory of this step, committed at the end
                path = tmp / ".checkpoints" / f"step{step}"
                path.mkdir(parents=True)
                _save_dir(path, model, tok, _manifest(checkpoint_dir(out_dir, step).name, spec_n, training, arch_n,
                                                      config, ev, step, wall_s, n_params, checkpoint_of=name), rows)
                ckpt_tmp[step] = path

            rows, last_eval, wall = _train_steps(
                model, spec_n, seed=seed, steps=steps, batch_size=batch_size, n_val=n_val, betas=betas,
                weight_decay=weight_decay, clip_norm=clip_norm, ckpts=ckpts, eval_every=eval_every,
                log_every=log_every, log=log, save_checkpoint=save_checkpoint,
                sched=dict(lr=lr, steps=steps, warmup_steps=warmup_steps, schedule=schedule,
                           min_lr_ratio=min_lr_ratio))
            manifest = _manifest(name, spec_n, training, arch_n, config, last_eval, steps, wall, n_params)
            _save_dir(tmp, model, tok, manifest, rows)
            check_tokenizer(AutoTokenizer.from_pretrained(tmp), spec_n)
            done = _commit_training(tmp, out_dir, ckpt_tmp)
        log(f"wind tunnel {name}: saved {out_dir} ({wall:.1f} s training, val MAE {last_eval['mae_bits']:.4f} bits)")
        return {"model_dir": out_dir, "manifest": manifest, "checkpoints": done}
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_training(*, steps, batch_size, warmup_steps, threads, n_val, lr, clip_norm, weight_decay, schedule,
                    checkpoints) -> list[int]:
    """The training settings' checks (before anything is built); returns the sorted checkpoint steps.

    Raises:
        ValueError: naming the argument and what is valid."""
    for key, val, lo in (("steps", steps, 1), ("batch_size", batch_size, 1), ("warmup_steps", warmup_steps, 0),
                         ("threads", threads, 1), ("n_val", n_val, 1)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < lo:
            raise ValueError(f"{key} = {val!r}: must be an integer >= {lo}")
    for key, val in (("lr", lr), ("clip_norm", clip_norm)):
        if not (isinstance(val, (int, float)) and math.isfinite(val) and val > 0):
            raise ValueError(f"{key} = {val!r}: must be a finite number > 0")
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay = {weight_decay!r}: must be a finite number >= 0")
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"schedule = {schedule!r}: must be 'cosine' or 'constant'")
    ckpts = sorted({int(k) for k in checkpoints})
    if any(not 0 <= k <= steps for k in ckpts):
        raise ValueError(f"checkpoints = {list(checkpoints)!r}: every step must lie in 0..steps = {steps} "
                         "(0: the initialization, the null model)")
    return ckpts


@contextlib.contextmanager
def _deterministic(threads: int, seed: int):
    """torch with ``threads`` intra-op threads, deterministic algorithms and seed ``seed`` for the block; the
    previous settings come back after it."""
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_fill = torch.utils.deterministic.fill_uninitialized_memory
    try:
        torch.set_num_threads(int(threads))
        torch.use_deterministic_algorithms(True)
        # deterministic mode also NaN-fills every new uninitialized tensor (~300 fills a step); the
        # trainer never reads uninitialized memory, so the weights are bit-identical without it
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.manual_seed(int(seed))
        yield
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det)
        torch.utils.deterministic.fill_uninitialized_memory = prev_fill


def _train_steps(model, spec_n, *, seed, steps, batch_size, n_val, betas, weight_decay, clip_norm, ckpts,
                 eval_every, log_every, log, save_checkpoint, sched) -> tuple[list[dict], dict, float]:
    """The training loop of :func:`train_wind_tunnel`: AdamW steps on cross-entropy at the answer positions, a log
    row every ``log_every`` steps, validation every ``eval_every`` (and at each checkpoint and the last step),
    ``save_checkpoint(step, eval, wall_s, rows)`` at the steps of ``ckpts`` (step 0: before any step). Returns
    (log rows, the last validation, wall seconds).

    Raises:
        RuntimeError: a non-finite loss."""
    hmm_params = tasks.hmm_parameters(spec_n) if spec_n["kind"] == "hmm" else None
    train_rng = tasks.stream_rng(seed, tasks.STREAM_TRAIN)
    val = tasks.sample_batch(spec_n, n_val, tasks.stream_rng(seed, tasks.STREAM_VALID), hmm_params=hmm_params)
    cand = tasks.answer_token_ids(spec_n)
    pos = torch.as_tensor(tasks.query_positions(spec_n))
    lr = sched["lr"]
    # foreach: one multi-tensor kernel per update instead of a Python loop over the parameters
    # (same arithmetic per element: bit-identical weights, checked in tests/unit/wind_tunnel/test_wind_tunnel.py)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=tuple(betas), weight_decay=weight_decay, foreach=True)
    rows: list[dict] = []
    run_loss, run_n = 0.0, 0
    last_eval: dict = {}
    t0 = time.perf_counter()
    if 0 in ckpts:  # the initialization itself (the null model): no training step, no RNG drawn
        last_eval = evaluate(model, val, cand)
        model.train()
        save_checkpoint(0, last_eval, 0.0, [{"step": 0, "loss": "", "lr": 0.0, "val_mae_bits": last_eval["mae_bits"],
                                              "val_answer_mass": last_eval["answer_mass"],
                                              "val_kl_bits": last_eval["kl_bits"], "wall_s": 0.0}])
    for step in range(1, steps + 1):
        cur_lr = lr_at(step, **sched)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        b = tasks.sample_batch(spec_n, batch_size, train_rng, exact=False, hmm_params=hmm_params)
        logits = model(input_ids=torch.from_numpy(b["ids"])).logits[:, pos]  # [B, P, vocab]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(b["targets"]).reshape(-1))
        if not torch.isfinite(loss):
            raise RuntimeError(f"non-finite training loss at step {step}; lower lr ({lr})")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm, foreach=True)
        opt.step()
        run_loss += loss.item()
        run_n += 1
        do_eval = step % eval_every == 0 or step == steps or step in ckpts
        if not (do_eval or step % log_every == 0):
            continue
        row = {"step": step, "loss": run_loss / run_n, "lr": cur_lr, "val_mae_bits": "",
               "val_answer_mass": "", "val_kl_bits": "", "wall_s": round(time.perf_counter() - t0, 3)}
        run_loss, run_n = 0.0, 0
        msg = f"step {step}/{steps} loss {row['loss']:.4f} lr {cur_lr:.3e}"
        if do_eval:
            last_eval = evaluate(model, val, cand)
            row.update(val_mae_bits=last_eval["mae_bits"], val_answer_mass=last_eval["answer_mass"],
                       val_kl_bits=last_eval["kl_bits"])
            msg += (f" val_mae_bits {last_eval['mae_bits']:.4f} answer_mass {last_eval['answer_mass']:.4f}"
                    f" kl_bits {last_eval['kl_bits']:.4f}")
        rows.append(row)
        log(msg + f" ({row['wall_s']:.1f} s)")
        if step in ckpts:
            save_checkpoint(step, last_eval, row["wall_s"], rows)
    return rows, last_eval, time.perf_counter() - t0


def _commit_training(tmp: Path, out_dir: Path, ckpt_tmp: dict) -> dict:
    """Move the checkpoints' and the final model's complete directories into place (checkpoints first); returns
    step -> checkpoint directory."""
    done: dict[int, Path] = {}
    for step, path in ckpt_tmp.items():
        final = checkpoint_dir(out_dir, step)
        commit_dir(path, final)
        done[step] = final
    shutil.rmtree(tmp / ".checkpoints", ignore_errors=True)
    commit_dir(tmp, out_dir)
    return done


def _manifest(name, spec, training, arch, config, ev, step, wall, n_params, checkpoint_of=None) -> dict:
    import tokenizers
    import transformers

    m = {"model": name, "source": "wind_tunnel", "dtype": "float32", "revision": None,
         "created": datetime.now(timezone.utc).isoformat(), "weights_path": ".",
         "task": dict(spec), "training": dict(training), "arch": dict(arch), "step": int(step),
         "wall_s": round(float(wall), 3), "n_params": int(n_params),
         "sequence_length": tasks.sequence_length(spec), tasks.CANDIDATES_KEY: tasks.answer_token_ids(spec),
         "val_mae_bits": ev.get("mae_bits"), "val_mae_bits_by_t": ev.get("mae_bits_by_t"),
         "val_answer_mass": ev.get("answer_mass"), "val_kl_bits": ev.get("kl_bits"),
         "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                      "tokenizers": tokenizers.__version__, "numpy": np.__version__},
         "architecture": _arch_summary(config)}
    if checkpoint_of is not None:
        m["checkpoint_of"] = checkpoint_of
    return m
