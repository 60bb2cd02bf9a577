"""The Envoy descriptor set (gen/descriptor.pb) loads and carries every HTTP rule Envoy needs."""

import pathlib

import pytest
from google.api import annotations_pb2
from google.protobuf import descriptor_pb2, descriptor_pool

ROOT = pathlib.Path(__file__).resolve().parents[3]
DESCRIPTOR = ROOT / "gen" / "descriptor.pb"

EXPECTED_RULES = {
    # The native RPCs are gRPC only; their HTTP routes take the raw body (services/preprocess/
    # native_json.py: the transcoder would drop unknown fields) and answer the typed messages.
    "Generate": None,
    "GenerateStream": None,
    "Session": None,
    "Append": None,
    "Cancel": None,
    "GenerateJson": ("post", "/v1/generate"),
    "GenerateStreamJson": ("post", "/v1/generate_stream"),
    "SessionJson": ("post", "/v1/session"),
    "AppendJson": ("post", "/v1/requests/{request_id}:append"),
    "CancelJson": ("post", "/v1/requests/{request_id}:cancel"),
    # gRPC only: HTTP clients get the same list from ListOpenAIModels, with `created` a JSON
    # number (proto3 JSON prints this RPC's int64 as a string).
    "ListModels": None,
    "CreateChatCompletion": ("post", "/v1/chat/completions"),
    "CreateCompletion": ("post", "/v1/completions"),
    "ListOpenAIModels": ("get", "/v1/models"),
    "RetrieveOpenAIModel": ("get", "/v1/models/{model=**}"),
    "CreateMessage": ("post", "/v1/messages"),
    "CountMessageTokens": ("post", "/v1/messages/count_tokens"),
    "CreateModelResponse": ("post", "/v1/responses"),
    "RetrieveModelResponse": ("get", "/v1/responses/{response_id}"),
    "DeleteModelResponse": ("delete", "/v1/responses/{response_id}"),
    "CancelModelResponse": ("post", "/v1/responses/{response_id}/cancel"),
    "Tokenize": ("post", "/tokenize"),
    "Detokenize": ("post", "/detokenize"),
    "CreateEmbedding": ("post", "/v1/embeddings"),
    "GetVersion": ("get", "/version"),
}


@pytest.fixture(scope="module")
def file_set():
    fds = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR.read_bytes())
    return {f.name: f for f in fds.file}


def test_descriptor_set_includes_imports_and_rich_error_protos(file_set):
    for name in ["google/api/annotations.proto", "google/api/http.proto", "google/api/httpbody.proto",
                 "google/rpc/status.proto", "google/rpc/error_details.proto",
                 "google/protobuf/struct.proto", "mstar/v1/messages.proto", "buf/validate/validate.proto"]:
        assert name in file_set, f"{name} missing: Envoy cannot build its pool / render rich errors"


def test_descriptor_set_builds_a_pool_with_both_services(file_set):
    pool = descriptor_pool.DescriptorPool()
    pending = dict(file_set)
    while pending:  # add in dependency order
        progressed = False
        for name, fdp in list(pending.items()):
            if all(dep not in pending for dep in fdp.dependency):
                pool.Add(fdp)
                del pending[name]
                progressed = True
        assert progressed, f"unresolvable imports in {sorted(pending)}"
    assert pool.FindServiceByName("mstar.v1.InferenceService")
    assert pool.FindServiceByName("mstar.generation.v1.GenerationService")
    assert pool.FindMessageTypeByName("google.rpc.Status")


def test_every_public_rpc_has_its_http_rule(file_set):
    service = next(s for s in file_set["mstar/v1/inference_service.proto"].service if s.name == "InferenceService")
    rules = {}
    for method in service.method:
        ext = method.options.Extensions[annotations_pb2.http]
        pattern = ext.WhichOneof("pattern")
        rules[method.name] = (pattern, getattr(ext, pattern)) if pattern else None
    assert rules == EXPECTED_RULES
