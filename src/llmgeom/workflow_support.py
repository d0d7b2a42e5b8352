"""Config helpers used by the Snakemake rules (kept here so they are tested).

Source: DESIGN.md section 1 (model sweeps, params as rule ``params:``).
"""

from __future__ import annotations

SOURCE_KEYS = ("source", "package", "gguf_file", "path", "repo_id", "revision")


class ConfigError(ValueError):
    """A config value that is valid JSON-schema-wise but cannot work; names key, value and fix."""


def apply_model_defaults(config: dict, schema: dict) -> dict:
    """Fill per-model defaults from the schema (``validate`` does not descend into
    ``additionalProperties``). Mutates and returns ``config``."""
    props = schema["properties"]["models"]["additionalProperties"]["properties"]
    for spec in config.get("models", {}).values():
        for key, p in props.items():
            if "default" in p and key not in spec:
                spec[key] = p["default"]
    return config


def check_config(config: dict) -> None:
    """Cross-key checks that JSON schema cannot express.

    Raises:
        ConfigError: an analysis names a prompt set that is not defined, the
            intrinsic-dimension set is not a corpus set, or the value-manifold
            sets include a corpus set.
    """
    sets = config["prompts"]["sets"]
    for s in config["value_manifold"]["prompt_sets"]:
        if s not in sets:
            raise ConfigError(f"value_manifold.prompt_sets contains {s!r}, which is not in prompts.sets "
                              f"({', '.join(sorted(sets))}); add it under prompts.sets or remove it")
    ids = config["intrinsic_dimension"]["prompt_set"]
    if ids not in sets or sets[ids]["kind"] != "corpus":
        raise ConfigError(f"intrinsic_dimension.prompt_set is {ids!r}; it must name a prompt set of kind "
                          "corpus in prompts.sets")


def model_source_params(spec: dict) -> dict:
    """Only the keys that determine the prepared model (so batch size changes don't re-prepare)."""
    return {k: spec[k] for k in SOURCE_KEYS if spec.get(k) is not None}


def extract_mem_mb(spec: dict, attempt: int = 1) -> int:
    """Memory for the GPU rules: the model's declared mem_mb, scaled by the retry attempt."""
    return int(spec["mem_mb"] * (1 + 0.5 * (attempt - 1)))


def set_threads(n: int) -> None:
    """Limit torch's intra-op threads to the job's declared threads."""
    import torch

    torch.set_num_threads(max(int(n), 1))


class run_logged:
    """Context manager for Snakemake scripts: tee stdout/stderr into the rule's log file,
    and write the full traceback there when the job fails (then re-raise)."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        import sys
        from pathlib import Path

        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "w")
        self._out, self._err = sys.stdout, sys.stderr
        sys.stdout = _Tee(self._out, self.fh)
        sys.stderr = _Tee(self._err, self.fh)
        return self

    def __exit__(self, et, ev, tb):
        import sys
        import traceback

        if et is not None:
            traceback.print_exception(et, ev, tb, file=self.fh)
        sys.stdout, sys.stderr = self._out, self._err
        self.fh.close()
        return False


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            st.flush()
