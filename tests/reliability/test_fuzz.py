"""Property-based fuzzing of the public surfaces (R12 and the catch-all for R09–R13): generated
HTTP bodies and gRPC PreprocessInputs, MSTAR_FUZZ_EXAMPLES of each (100 in `make test`, 10,000
in `make test-reliability`). Properties: no 5xx, no server-side INTERNAL/UNKNOWN, every stream
ends with one terminal event, and the stack is healthy and idle afterwards.

The fuzz rig caps max_tokens at 4 (`--max-tokens-cap 4`) with a zero-cost null engine step, so
a generated request that happens to be valid finishes at once instead of generating 8k tokens.
"""

from __future__ import annotations

import json
import math

import grpc
import httpx
import pytest
from google.protobuf import struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc
from mstar.v1 import messages_pb2 as pb

from tests.reliability.conftest import FUZZ_EXAMPLES, started_rig

pytestmark = pytest.mark.reliability

FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
BAD_GRPC = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DATA_LOSS, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.DEADLINE_EXCEEDED}


@pytest.fixture(scope="module")
def fuzz_rig(tmp_path_factory):
    with started_rig(tmp_path_factory.mktemp("fuzz"), preprocess_args=("--max-tokens-cap", "4")) as r:
        yield r
        r.check_recovered()


# ---- strategies

NUMBERS = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["NaN", "Infinity", "-1", "1e9", "0x10", "", "256"]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20))
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                      max_size=4), max_leaves=12)
SAMPLING_KEYS = ["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
                 "presence_penalty", "seed", "max_tokens", "stop", "stop_token_ids", "ignore_eos", "logprobs",
                 "include_stop_str_in_output", "n"]
MODALITIES = st.sampled_from(["MODALITY_TEXT", "MODALITY_TOKENS", "MODALITY_IMAGE", "MODALITY_UNSPECIFIED", 7, -1])
PART = st.fixed_dictionaries({}, optional={
    "modality": MODALITIES, "text": st.text(max_size=30), "data": st.sampled_from(["", "AAEC", "!!"]),
    "file_path": st.sampled_from(["/etc/passwd", "../x", "x.txt", ""]),
    "token_ids": st.fixed_dictionaries({"ids": st.lists(st.integers(-5, 60_000), max_size=8)}),
    "mime_type": st.text(max_size=10)})
NATIVE = st.fixed_dictionaries({}, optional={
    "text": st.text(max_size=40), "request_id": st.text(max_size=12), "client_request_id": st.text(max_size=12),
    "model": st.sampled_from(["", "default", "other", "x" * 300]),
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "", "x"]),
                                                "content": st.text(max_size=30)}), max_size=3),
    "prompt_parts": st.lists(PART, max_size=3),
    "input_modalities": st.lists(MODALITIES, max_size=2), "ends": st.lists(MODALITIES, max_size=2),
    "model_kwargs": st.fixed_dictionaries({}, optional={
        "sampling": st.dictionaries(st.sampled_from(SAMPLING_KEYS), JSON, max_size=5),
        "extra": st.dictionaries(st.text(max_size=6), SCALARS, max_size=2)}),
})
OPENAI = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["default", "", "nope", 5]), "prompt": st.one_of(st.text(max_size=30), JSON),
    "messages": st.one_of(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool", 1]),
                                                          "content": st.one_of(st.text(max_size=20), JSON)}),
                                   max_size=3), JSON),
    "max_tokens": NUMBERS, "max_completion_tokens": NUMBERS, "temperature": NUMBERS, "top_p": NUMBERS,
    "n": NUMBERS, "stream": st.one_of(st.booleans(), JSON), "stop": JSON, "logprobs": JSON, "top_logprobs": NUMBERS,
    "seed": NUMBERS, "stream_options": JSON, "user": JSON, "bogus_field": JSON,
})
PATHS = ["/v1/generate", "/v1/generate_stream", "/v1/chat/completions", "/v1/completions", "/v1/session",
         "/v1/requests/abc:cancel", "/v1/requests/abc:append", "/v1/models", "/v1/nope"]


def _body(draw_json) -> bytes:
    if isinstance(draw_json, dict) and isinstance(draw_json.get("input_modalities"), list):
        # An input stream left open legitimately waits for appends (the fuzzer sends none);
        # closing it keeps every example bounded. Unary + open input has its own test (R24).
        draw_json = {**draw_json, "ends": draw_json["input_modalities"]}
    try:
        return json.dumps(draw_json, allow_nan=True).encode()
    except (ValueError, OverflowError):
        return b"{}"


BODIES = st.one_of(
    NATIVE.map(_body), OPENAI.map(_body), JSON.map(_body), st.binary(max_size=200),
    st.builds(lambda d: _body({"input": d}), NATIVE),  # a wrong nesting level
)


def _check_http(reply: httpx.Response, path: str) -> None:
    assert reply.status_code < 500, (path, reply.status_code, reply.text[:300])
    if reply.status_code == 200 and "text/event-stream" in reply.headers.get("content-type", ""):
        frames = [line for line in reply.text.splitlines() if line.startswith("data:")]
        if path == "/v1/session" and not frames:
            return  # an empty session (`[]`) legitimately ends OK with no events
        assert frames, reply.text[:300]
        terminal = [f for f in frames if '"complete"' in f or '"failed"' in f or '"error"' in f
                    or f == "data: [DONE]" or '"finish_reason":"' in f.replace(" ", "")]
        assert terminal, (path, frames[-2:])
        assert '"code":13' not in reply.text.replace(" ", "") and "INTERNAL" not in reply.text, reply.text[-300:]


def test_fuzz_http_surface(fuzz_rig):
    client = httpx.Client(base_url=fuzz_rig.http, timeout=30)

    @FUZZ
    @given(path=st.sampled_from(PATHS), body=BODIES,
           ctype=st.sampled_from(["application/json", "text/plain", "", "application/grpc-web+json"]))
    def run(path, body, ctype):
        headers = {"content-type": ctype} if ctype else {}
        method = "GET" if path == "/v1/models" else "POST"
        _check_http(client.request(method, path, content=body, headers=headers), path)

    try:
        run()
    finally:
        client.close()
    fuzz_rig.check_recovered()


FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32)


@st.composite
def preprocess_inputs(draw) -> pb.PreprocessInput:
    msg = pb.PreprocessInput(text=draw(st.text(max_size=40)), request_id=draw(st.text(max_size=10)),
                             model=draw(st.sampled_from(["", "default", "other"])))
    for _ in range(draw(st.integers(0, 2))):
        msg.messages.add(role=draw(st.sampled_from(["user", "system", "x", ""])), content=draw(st.text(max_size=20)))
    for _ in range(draw(st.integers(0, 2))):
        part = msg.prompt_parts.add(modality=draw(st.integers(-1, 7)), mime_type=draw(st.text(max_size=8)))
        kind = draw(st.sampled_from(["text", "data", "file_path", "token_ids", "none"]))
        if kind == "text":
            part.text = draw(st.text(max_size=20))
        elif kind == "data":
            part.data = draw(st.binary(max_size=16))
        elif kind == "file_path":
            part.file_path = draw(st.sampled_from(["/etc/passwd", "../x", "x", ""]))
        elif kind == "token_ids":
            part.token_ids.ids.extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6)))
    opened = draw(st.lists(st.integers(-1, 7), max_size=2))
    msg.input_modalities.extend(opened)
    msg.ends.extend(opened)  # unary Generate: an open input would (rightly) wait for appends forever
    msg.output_modalities.extend(draw(st.lists(st.integers(-1, 7), max_size=2)))
    s = msg.model_kwargs.sampling
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"):
        if draw(st.booleans()):
            setattr(s, name, draw(FLOATS))
    for name, lo, hi in (("top_k", -(2**31), 2**31 - 1), ("max_tokens", -(2**31), 2**31 - 1),
                         ("logprobs", -5, 100), ("n", -5, 1000), ("seed", -(2**63), 2**63 - 1)):
        if draw(st.booleans()):
            setattr(s, name, draw(st.integers(lo, hi)))
    s.stop.extend(draw(st.lists(st.text(max_size=8), max_size=3)))
    s.stop_token_ids.extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3)))
    s.ignore_eos = draw(st.booleans())
    if draw(st.booleans()):
        msg.model_kwargs.extra.update({draw(st.text(max_size=5)): draw(st.one_of(st.text(max_size=5), FLOATS.filter(
            math.isfinite)))})
    return msg


def test_fuzz_grpc_surface(fuzz_rig):
    channel = grpc.insecure_channel(fuzz_rig.grpc)
    stub = api_grpc.InferenceServiceStub(channel)

    @FUZZ
    @given(msg=preprocess_inputs(), streaming=st.booleans())
    def run(msg, streaming):
        try:
            if streaming:
                events = [e.WhichOneof("event") for e in stub.GenerateStream(
                    api.GenerateStreamRequest(input=msg), timeout=20)]
                assert events.count("complete") + events.count("failed") == 1, events
            else:
                stub.Generate(api.GenerateRequest(input=msg), timeout=20)
        except grpc.RpcError as e:
            assert e.code() not in BAD_GRPC, (e.code(), e.details(), msg)

    try:
        run()
    finally:
        channel.close()
    fuzz_rig.check_recovered()


def test_struct_extra_keys_are_refused(fuzz_rig):
    """A sanity anchor for the fuzz properties: a known-bad input is refused, not ignored."""
    msg = pb.PreprocessInput(text="hi", model_kwargs=pb.ModelKwargs(extra=struct_pb2.Struct()))
    msg.model_kwargs.extra.update({"unknown_knob": 1})
    with grpc.insecure_channel(fuzz_rig.grpc) as channel, pytest.raises(grpc.RpcError) as err:
        api_grpc.InferenceServiceStub(channel).Generate(api.GenerateRequest(input=msg), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
