#!/usr/bin/env bash
# GPU check: the CUDA correctness tests (pytest -m gpu tests/kernels), the kernel benchmarks
# (bench/kernels.py, rewrites the results section of docs/kernels.md), then the engine vs HF
# generate() benchmark on the GPU (bench/engine.py, appends to docs/benchmarks-engine.md; the
# generation issue's ">= 5x HF at 16 sequences" is measured there).
# Sized for < 10 minutes on one H200: each step has its own timeout. Run from anywhere:
#   bash bench/gpu_check.sh            (or: make bench-gpu)
#   PYTHON=/path/to/python QUICK=1 bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON="$(command -v python3)"

# Real kernels on the GPU: the interpreter must be off (tests/kernels/conftest.py sets it only
# when torch sees no CUDA device).
unset TRITON_INTERPRET

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: torch ($("$PYTHON" -c 'import torch; print(torch.__version__)')) sees no CUDA device;" \
       "this check needs a GPU and a CUDA build of torch" >&2
  exit 2
fi
"$PYTHON" -c 'import torch, triton; print(f"gpu_check: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")'

echo "gpu_check: correctness (pytest -m gpu tests/kernels)"
timeout 240 "$PYTHON" -m pytest -q -m gpu tests/kernels -p no:cacheprovider

echo "gpu_check: benchmarks (bench/kernels.py)"
bench_args=(--out docs/kernels.md)
if [[ -n "${QUICK:-}" ]]; then bench_args+=(--quick); fi
timeout 240 "$PYTHON" -m bench.kernels "${bench_args[@]}"

echo "gpu_check: engine vs HF generate() on the GPU (bench/engine.py)"
timeout 240 "$PYTHON" -m bench.engine --device cuda --threads 1 --variants bfloat16 --batches 1 4 16 --mixed-requests 64
echo "gpu_check: done; results in docs/kernels.md and docs/benchmarks-engine.md"
