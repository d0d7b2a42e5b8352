"""Shared test setup: everything runs offline, on CPU.

The environment variables are set at import time, before transformers or
huggingface_hub are imported by any test module (huggingface_hub reads
HF_HUB_OFFLINE once, when it is first imported).
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
#: The tiny end-to-end study (two tiny random models committed in .test/models/); `snakemake --directory .test`
#: runs it as it is, the workflow tests run it in a temporary directory (tiny_config).
TEST_DIR = REPO / ".test"
TEST_CONFIG = TEST_DIR / "config" / "config.yaml"


def tiny_config(model_dirs: dict | None = None) -> dict:
    """A fresh copy of .test/config/config.yaml for a run in another working directory: each model's ``path``
    made absolute (the committed .test/models/<name>), or ``model_dirs[name]`` where given."""
    cfg = yaml.safe_load(TEST_CONFIG.read_text())
    for name, spec in cfg["models"].items():
        spec["path"] = str((model_dirs or {}).get(name) or (TEST_DIR / spec["path"]).resolve())
    return cfg
