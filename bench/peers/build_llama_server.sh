#!/usr/bin/env bash
# Build llama.cpp's native `llama-server` (the C++ peer) from the llama.cpp tree vendored in the
# llama-cpp-python sdist on PyPI. The build takes ~8 min on 2 cores, so it is cached outside the
# repo and reused by `make bench` whenever the binary exists. Idempotent.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${MSTAR_CACHE:-$HOME/.cache/mstar}/llama.cpp"
PY="$(realpath "${PYTHON:-.venv/bin/python}")"
JOBS="${JOBS:-2}"
BIN="$CACHE/build/bin/llama-server"

if [[ -x "$BIN" ]]; then
  echo "llama-server already built: $BIN"
  exit 0
fi

mkdir -p "$CACHE"
cd "$CACHE"
if [[ ! -d src ]]; then
  # The sdist only: the binary wheel has no llama-server, and we never use the Python server.
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    -d dl "llama-cpp-python==$VERSION"
  mkdir -p src.tmp
  tar -xzf "dl/llama_cpp_python-$VERSION.tar.gz" -C src.tmp --strip-components=1
  mv src.tmp src
fi

# GGML_NATIVE: tune for this CPU, as a user building the peer would. No curl: the GGUF is local.
cmake -S src/vendor/llama.cpp -B build -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build build --target llama-server -j"$JOBS"
test -x "$BIN"
echo "built: $BIN"
