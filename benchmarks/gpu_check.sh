#!/usr/bin/env bash
# GPU check for issues 7 and 13: the full extraction of real model shapes on one CUDA GPU in bfloat16 (tokens/s,
# peak GPU memory, host RSS, HDF5 bytes per prompt), a GPU/CPU device_map split against the single-device
# result, the memory check, and (issue 13) sdpa extraction with hooked attention entropies vs the body-only
# forward and vs eager, flash attention if installed, and the model server. Needs torch (CUDA), transformers, h5py, numpy; llmgeom from src/ (no install).
#
# On the device machine (its python3 holds torch/transformers/h5py), with the device tool's `run`:
#   command: bash benchmarks/gpu_check.sh
#   carry:   ["resources/models/smollm2-135m/config.json", "resources/models/smollm2-135m/tokenizer.json",
#             "resources/models/smollm2-135m/tokenizer_config.json", "resources/models/smollm2-135m/manifest.json",
#             "resources/prompts/mixed.jsonl", "resources/prompts/corpus.jsonl"]
#   (after `snakemake` has prepared smollm2-135m and built the prompt sets here; only small files travel)
# Results: $OUT/gpu_check.json and $OUT/gpu_check.md (else benchmarks/results/). Expected time: ~5 min on an H200.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export HDF5_USE_FILE_LOCKING=FALSE TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c "import torch, transformers, h5py; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
"$PY" benchmarks/gpu_check.py --out "${OUT:-benchmarks/results}" "$@"
