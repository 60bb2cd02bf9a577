#!/bin/sh
# Generate the Python stubs and Envoy's descriptor set inside an image build: the same protoc
# calls as `make proto`, without the venv bootstrap around them. Needs grpcio-tools and
# googleapis-common-protos installed. Usage: gen_protos.sh OUT_DIR
set -eu
out="$1"
mkdir -p "$out" build/googleapis/google
src=$(python -c 'import google.api.http_pb2 as m, os; print(os.path.dirname(os.path.dirname(os.path.dirname(m.__file__))))')
for d in api rpc; do mkdir -p build/googleapis/google/$d && cp "$src"/google/$d/*.proto build/googleapis/google/$d/; done
wkt=$(python -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
python -m grpc_tools.protoc -I protos -I build/googleapis -I "$wkt" \
  --python_out="$out" --grpc_python_out="$out" protos/mstar/v1/*.proto
python -m grpc_tools.protoc -I protos -I build/googleapis -I "$wkt" \
  --include_imports --include_source_info --descriptor_set_out="$out/descriptor.pb" \
  protos/mstar/v1/*.proto google/rpc/status.proto google/rpc/error_details.proto
touch "$out/mstar/__init__.py" "$out/mstar/v1/__init__.py"
