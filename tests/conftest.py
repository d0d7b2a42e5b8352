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
