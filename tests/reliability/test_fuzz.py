"""Property-based fuzzing of the public surfaces (R12 and the catch-all for R09–R13): generated
HTTP bodies and gRPC PreprocessInputs, MSTAR_FUZZ_EXAMPLES of each (100 in `make test`, 10,000
in `make test-reliability`). Properties: no 5xx, no server-side INTERNAL/UNKNOWN, every stream
ends with one terminal event, and the stack is healthy and idle afterwards.

Issue 13 added the shapes outside the happy sizes on every surface: lone UTF-16 surrogates in
JSON, huge repeated fields (parts, messages, stop strings, token ids), oversize and odd ids in
bodies, paths and Session actions, odd grpc-timeout headers and undecodable gRPC bytes, plus two
properties: an error never carries more than a short quote of the input (bounded size), and a
Session never sends anything for a request after its terminal event.

The fuzz rig caps max_tokens at 4 (`--max-tokens-cap 4`) with a zero-cost null engine step, so
a generated request that happens to be valid finishes at once instead of generating 8k tokens.
"""

from __future__ import annotations

import json
import math
from collections import Counter

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
# Ids around and far past the declared bound (128 URL-safe characters), and odd characters.
IDS = st.one_of(st.text(max_size=12), st.sampled_from(["", "a" * 128, "a" * 129, "i" * 20_000, "a b", "a:b",
                                                       "x/y", "\u00e9t\u00e9", "..", "%41"]))
# How long a repeated field is: empty, typical, just over and far over its declared bound.
COUNTS = st.sampled_from([0, 1, 3, 257, 1025, 5000])


def _body(draw_json) -> bytes:
    if isinstance(draw_json, dict) and isinstance(draw_json.get("input_modalities"), list):
        # An input stream left open legitimately waits for appends (the fuzzer sends none);
        # closing it keeps every example bounded. Unary + open input has its own test (R24).
        draw_json = {**draw_json, "ends": draw_json["input_modalities"]}
    try:
        return json.dumps(draw_json, allow_nan=True).encode()
    except (ValueError, OverflowError):
        return b"{}"


@st.composite
def huge_bodies(draw) -> bytes:
    """Valid JSON whose repeated fields or ids are far outside the declared bounds."""
    n = draw(COUNTS)
    shape = draw(st.sampled_from(["parts", "messages", "stop", "token_ids", "id", "openai_messages",
                                  "openai_stop", "openai_prompt_ids"]))
    if shape == "parts":
        body = {"prompt_parts": [{"text": "a"}] * n}
    elif shape == "messages":
        body = {"messages": [{"role": "user", "content": "hi"}] * n}
    elif shape == "stop":
        body = {"text": "hi", "model_kwargs": {"sampling": {"stop": ["s"] * n}}}
    elif shape == "token_ids":
        body = {"prompt_parts": [{"modality": "MODALITY_TOKENS", "token_ids": {"ids": [5] * (n * 400)}}]}
    elif shape == "id":
        body = {"text": "hi", draw(st.sampled_from(["request_id", "client_request_id", "model"])): draw(IDS)}
    elif shape == "openai_messages":
        body = {"messages": [{"role": "user", "content": "hi"}] * max(n, 1)}
    elif shape == "openai_stop":
        body = {"prompt": "hi", "stop": ["s"] * n}
    else:
        body = {"prompt": [5] * (n * 400)}
    return _body(body)


# JSON text with a \uXXXX surrogate escape spliced into a string: lone, reversed or paired.
SURROGATES = st.builds(
    lambda field, escape: f'{{"{field}": "a{escape}b", "model": "default", "prompt": "x", "text": "x"}}'.encode(),
    st.sampled_from(["text", "prompt", "model", "request_id", "stop"]),
    st.sampled_from(["\\ud800", "\\udfff", "\\udc00\\ud800", "\\ud83d\\ude00", "\\ud800\\u0041"]),
) | st.builds(lambda: b'{"messages": [{"role": "user", "content": "\\udbff"}]}')

BODIES = st.one_of(
    NATIVE.map(_body), OPENAI.map(_body), JSON.map(_body), st.binary(max_size=200),
    st.builds(lambda d: _body({"input": d}), NATIVE),  # a wrong nesting level
    huge_bodies(), SURROGATES,
)
GRPC_TIMEOUTS = st.sampled_from([None, None, "10S", "abc", "-1S", "1", "123456789S", "5m", "5 S", "5s"])


def _check_http(reply: httpx.Response, path: str) -> None:
    assert reply.status_code < 500, (path, reply.status_code, reply.text[:300])
    if reply.status_code >= 400:  # an error quotes at most a short prefix of the input
        assert len(reply.content) < 4096, (path, reply.status_code, len(reply.content))
        assert "Traceback" not in reply.text and "Error(" not in reply.text, reply.text[:300]
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
    @given(path=st.one_of(st.sampled_from(PATHS), st.builds("/v1/requests/{}:{}".format, IDS,
                                                            st.sampled_from(["cancel", "append"]))),
           body=BODIES, timeout=GRPC_TIMEOUTS,
           ctype=st.sampled_from(["application/json", "text/plain", "", "application/grpc-web+json"]))
    def run(path, body, ctype, timeout):
        headers = {"content-type": ctype} if ctype else {}
        if timeout is not None:
            headers["grpc-timeout"] = timeout
        method = "GET" if path == "/v1/models" else "POST"
        try:
            reply = client.request(method, path, content=body, headers=headers)
        except httpx.InvalidURL:
            return  # the client itself refuses the path (a space, a control character)
        _check_http(reply, path)

    try:
        run()
    finally:
        client.close()
    fuzz_rig.check_recovered()


FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32)


@st.composite
def preprocess_inputs(draw) -> pb.PreprocessInput:
    msg = pb.PreprocessInput(text=draw(st.text(max_size=40)), request_id=draw(IDS),
                             client_request_id=draw(IDS), model=draw(st.sampled_from(["", "default", "other",
                                                                                      "m" * 100_000])))
    for _ in range(draw(st.integers(0, 2))):
        msg.messages.add(role=draw(st.sampled_from(["user", "system", "x", ""])), content=draw(st.text(max_size=20)))
    if draw(st.integers(0, 5)) == 0:  # far over the declared counts: refused from the count alone
        msg.messages.extend([pb.ChatMessage(role="user", content="hi")] * draw(COUNTS))
        msg.prompt_parts.extend([pb.PromptPart(text="a")] * draw(COUNTS))
        msg.prompt_parts.add(modality=pb.MODALITY_TOKENS).token_ids.ids.extend([5] * draw(COUNTS) * 400)
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
    s.stop.extend(["s"] * draw(st.sampled_from([0, 0, 17, 3000])))
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
            assert e.code() not in BAD_GRPC, (e.code(), e.details()[:300])
            assert len(e.details() or "") <= 1024, len(e.details())

    try:
        run()
    finally:
        channel.close()
    fuzz_rig.check_recovered()


@st.composite
def session_actions(draw) -> list[api.SessionRequest]:
    """A Session's messages: starts (possibly reusing or inventing ids), appends and cancels
    naming known, finished, unknown or oversize ids, and an occasional empty action."""
    ids = draw(st.lists(IDS, min_size=1, max_size=3))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["start", "start", "append", "cancel", "empty"]))
        rid = draw(st.sampled_from(ids))
        if kind == "start":
            inp = draw(preprocess_inputs())
            inp.request_id = rid
            out.append(api.SessionRequest(start=inp))
        elif kind == "append":
            out.append(api.SessionRequest(append=pb.ClientAppend(
                request_id=rid, text=draw(st.text(max_size=10)), ends=draw(st.lists(st.integers(-1, 7), max_size=2)),
                chunks=[pb.PromptPart(text="a")] * draw(st.sampled_from([0, 1, 300])))))
        elif kind == "cancel":
            out.append(api.SessionRequest(cancel=api.SessionCancel(request_id=rid)))
        else:
            out.append(api.SessionRequest())
    return out


def test_fuzz_session_surface(fuzz_rig):
    """Session, Append and Cancel with generated ids and actions: never a server error, never an
    event for a request after its terminal one (issue 13, finding 6), errors bounded in size."""
    channel = grpc.insecure_channel(fuzz_rig.grpc)
    stub = api_grpc.InferenceServiceStub(channel)

    @FUZZ
    @given(actions=session_actions(), unary_id=IDS)
    def run(actions, unary_id):
        starts = Counter(a.start.request_id for a in actions if a.WhichOneof("action") == "start")
        chosen = set(starts)
        ended: set[str] = set()
        terminals: Counter = Counter()
        try:
            for event in stub.Session(iter(actions), timeout=20):
                kind = event.WhichOneof("event")
                rid = getattr(event, kind).request_id
                if kind == "accepted":
                    ended.discard(rid)  # the client may reuse an id once its request ended
                    if rid not in chosen:
                        starts[rid] += 1  # a start without an id, under the id the server gave it
                # After a request's terminal event only another start of that id may be heard of:
                # accepted, or failed when that start too was refused.
                assert not rid or rid not in ended or kind == "failed", f"{kind} for {rid!r} after its end"
                if kind in ("complete", "failed") and rid:
                    ended.add(rid)
                    terminals[rid] += 1
                    assert terminals[rid] <= starts[rid], f"more terminal events than starts for {rid!r}"
                if kind == "failed":
                    assert len(event.failed.message) <= 1024 and event.failed.code != 0
        except grpc.RpcError as e:
            # An open input nobody ends times out the session's deadline; that is the client's doing.
            assert e.code() not in BAD_GRPC - {grpc.StatusCode.DEADLINE_EXCEEDED}, (e.code(), e.details()[:300])
            assert len(e.details() or "") <= 1024
        for call in (lambda: stub.Cancel(api.CancelRequest(request_id=unary_id), timeout=10),
                     lambda: stub.Append(api.AppendRequest(append=pb.ClientAppend(request_id=unary_id, text="x")),
                                         timeout=10)):
            try:
                call()
            except grpc.RpcError as e:
                assert e.code() not in BAD_GRPC, (e.code(), e.details()[:300])
                assert len(e.details() or "") <= 1024

    try:
        run()
    finally:
        channel.close()
    fuzz_rig.check_recovered()


def test_fuzz_undecodable_grpc_bytes(fuzz_rig):
    """Bytes that may not be a message at all, on every public RPC: INVALID_ARGUMENT (or a
    normal answer when they happen to decode), never UNKNOWN (issue 13, finding 4)."""
    channel = grpc.insecure_channel(fuzz_rig.grpc)
    methods = ["Generate", "GenerateStream", "Append", "Cancel", "ListModels", "CreateCompletion"]

    @FUZZ
    @given(method=st.sampled_from(methods), raw=st.binary(max_size=64))
    def run(method, raw):
        streaming = method in ("GenerateStream", "CreateCompletion")
        make = channel.unary_stream if streaming else channel.unary_unary
        call = make(f"/mstar.v1.InferenceService/{method}", request_serializer=lambda b: b,
                    response_deserializer=lambda b: b)
        try:
            result = call(raw, timeout=20)
            if streaming:
                list(result)
        except grpc.RpcError as e:
            assert e.code() not in BAD_GRPC, (method, e.code(), e.details()[:300])

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
