"""Random-initialization twins of a model: the null model of every claim.

A claim about a trained model is a finding only when a model with the same architecture, tokenizer and
prompts but no training reads otherwise. The twin of a prepared model is built from its config alone:
``AutoModelForCausalLM.from_config`` under ``torch.manual_seed(seed)``, which runs the architecture's own
initializer (``PreTrainedModel._init_weights`` through ``post_init``), saved as a plain float32 Hugging
Face directory with the trained model's tokenizer, so every rule treats it as a model of its own.

* :func:`random_init_skeleton`: the architecture on the ``meta`` device (no memory); key orthogonality's
  per-layer random-init baseline materializes single modules of it (``llmgeom.weights.key_orthogonality``).
* :func:`check_random_init`: can a twin be built from this config (an initializer exists)? Raises
  :class:`NullModelError` with the reason, so that the claims read "not testable here" with it.
* :func:`prepare_random_init`: the twin's directory and manifest (``source: random_init``).

Source: DESIGN.md sec. 4 (a verdict can be true of any input).
"""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path

from llmgeom.core.io import atomic_dir
from llmgeom.models import families

#: ``source`` of a twin's model entry and manifest
RANDOM_INIT = "random_init"


class NullModelError(ValueError):
    """No random-init twin can be built for a model; the message says why."""


def random_init_skeleton(config):
    """The architecture of ``config`` on the ``meta`` device (no parameter memory), float32."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def check_random_init(config) -> None:
    """Refuse a config whose architecture has no initializer for its weights.

    Args:
        config: a transformers ``PretrainedConfig``.

    Raises:
        NullModelError: the model class has no ``_init_weights``, or the config has no
            ``initializer_range`` (the scale every transformers initializer reads), naming the model type.
    """
    mt = getattr(config, "model_type", "?")
    try:
        sk = random_init_skeleton(config)
    except Exception as e:  # a class that cannot be built from its config alone
        raise NullModelError(f"model_type {mt!r} cannot be built from its config ({type(e).__name__}: {e})") from e
    if not callable(getattr(sk, "_init_weights", None)):
        raise NullModelError(f"{type(sk).__name__} (model_type {mt!r}) has no _init_weights: no initializer to "
                             "draw a random-init twin from")
    if getattr(config, "initializer_range", None) is None and getattr(
            getattr(config, "text_config", None), "initializer_range", None) is None:
        raise NullModelError(f"the config of model_type {mt!r} has no initializer_range: the architecture's own "
                             "initializer is undefined for it")


def prepare_random_init(name: str, base_dir: str | Path, seed: int, out_dir: str | Path) -> dict:
    """Build the random-init twin of a prepared model into ``out_dir`` and return its manifest.

    Args:
        name: the twin's model name (e.g. ``smollm2-135m-randinit``).
        base_dir: the trained model's prepared directory (``resources/models/<model>``): its config and
            tokenizer are copied, none of its weights.
        seed: ``torch.manual_seed`` before ``from_config`` (the twin's weights are a function of it).
        out_dir: ``resources/models/<name>``; written under a temporary name and renamed when complete.

    Returns:
        The manifest (also ``out_dir/manifest.json``): model, source ``random_init``, null_of (the trained
        model's name), seed, dtype float32, architecture summary.

    Raises:
        NullModelError: the architecture has no initializer (:func:`check_random_init`).
        FileNotFoundError: ``base_dir`` is not a prepared model.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from llmgeom.models.loading import load_tokenizer, resolve_weights_path
    from llmgeom.models.sources import commit_prepared, read_manifest

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    base = read_manifest(base_dir)
    config = AutoConfig.from_pretrained(resolve_weights_path(base_dir))
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    try:
        check_random_init(config)
    except NullModelError as e:
        raise NullModelError(f"models.{base.get('model')}: no random-init twin {name} can be built: {e}. Run without "
                             "null models with `nulls: {random_init: false}` (every null column of the scorecard "
                             "then reads 'not testable here' with that reason)") from e
    tmp = atomic_dir(out_dir)
    try:
        torch.manual_seed(int(seed))
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.save_pretrained(tmp)
        load_tokenizer(base_dir).save_pretrained(tmp)
        manifest = {"model": name, "source": RANDOM_INIT, "null_of": base.get("model"), "seed": int(seed),
                    "dtype": base.get("dtype"),  # the base model's manifest always has it "weights_path": ".",
                    "init": f"{type(model).__name__}._init_weights via from_config under torch.manual_seed({int(seed)})",
                    "created": datetime.now(timezone.utc).isoformat(),
                    "architecture": families.summarize(model.config).as_dict()}
        commit_prepared(tmp, manifest, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest
