"""R09–R13: bad input is refused with 400/INVALID_ARGUMENT naming the field, before the engine
(its step/finish/failure counters do not move), and nothing crashes."""

from __future__ import annotations

import contextlib
import socket

import httpx
import pytest

from tests.reliability import probe

pytestmark = pytest.mark.reliability

CONTEXT = 8192  # the default model's context length (SmolLM2-135M GGUF)
ENGINE_COUNTERS = ("steps", "requests_finished", "requests_failed", "rejections")


@contextlib.contextmanager
def engine_untouched(rig):
    """The engine's cumulative counters are identical before and after the block."""
    before = rig.run(probe.conductor_status(rig.generation))
    yield
    after = rig.run(probe.conductor_status(rig.generation))
    moved = {k: (before.get(k), after.get(k)) for k in ENGINE_COUNTERS if before.get(k) != after.get(k)}
    assert not moved, f"the engine saw a request it should never have seen: {moved}"


def _tokens(n: int) -> dict:
    return {"prompt_parts": [{"modality": "MODALITY_TOKENS", "token_ids": {"ids": [100] * n}}]}


def _sampling(**kw) -> dict:
    return {"text": "hi", "model_kwargs": {"sampling": {"max_tokens": 2, **kw}}}


def _assert_400(reply: httpx.Response, field: str | None = None) -> None:
    assert reply.status_code == 400, (reply.status_code, reply.text[:300])
    body = reply.json()
    message = body.get("message") or body.get("error", {}).get("message", "")
    if field is not None:
        # The field is named in the message or in the BadRequest/param details of the body.
        assert field in reply.text, f"{field!r} not named in {reply.text[:300]}"
    assert message, reply.text


@pytest.fixture
def client(rig):
    with httpx.Client(base_url=rig.http, timeout=30) as c:
        yield c
    rig.check_recovered()


@pytest.mark.parametrize("n", [CONTEXT, CONTEXT + 1, 3 * CONTEXT])
def test_r09_prompt_at_or_over_context_refused_before_engine(rig, client, n):
    with engine_untouched(rig):
        _assert_400(client.post("/v1/generate", json=_tokens(n)), "prompt")
        reply = client.post("/v1/generate", json=_tokens(n) | {"model_kwargs": {"sampling": {"max_tokens": 1}}})
        assert reply.json()["details"][0]["reason"] == "PROMPT_TOO_LONG"


def test_r09_prompt_one_below_context_runs(client):
    reply = client.post("/v1/generate", json=_tokens(CONTEXT - 1) | {"model_kwargs": {"sampling": {"max_tokens": 5}}})
    assert reply.status_code == 200, reply.text[:300]
    complete = reply.json()["complete"]
    assert complete["usage"]["completion_tokens"] == 1  # clamped to the one free slot
    assert any("clamped" in w for w in complete["warnings"]), complete


@pytest.mark.parametrize("body,field", [
    (_sampling(max_tokens=0), "max_tokens"),
    (_sampling(max_tokens=-5), "max_tokens"),
    (_sampling(max_tokens=1.5), "max_tokens"),
    (_sampling(max_tokens="many"), "max_tokens"),
    ({"model_kwargs": {"sampling": {"max_tokens": 2}}}, "prompt"),  # no text/messages/parts
    ({"text": "hi", "messages": [{"role": "user", "content": "hi"}]}, None),  # exclusive
])
def test_r10_bad_lengths_and_missing_prompt(rig, client, body, field):
    with engine_untouched(rig):
        _assert_400(client.post("/v1/generate", json=body), field)


def test_r10_documented_clamp_and_quoted_int(client):
    """prompt + max_tokens > context is clamped with a warning (docs/preprocess.md); proto3 JSON
    accepts a quoted int64/int32 ("3"), so the native API takes it; OpenAI's schema does not."""
    reply = client.post("/v1/generate", json=_tokens(CONTEXT - 3) | {"model_kwargs": {"sampling": {"max_tokens": 100}}})
    assert reply.status_code == 200 and reply.json()["complete"]["usage"]["completion_tokens"] == 3
    reply = client.post("/v1/generate", json=_sampling(max_tokens="3"))
    assert reply.status_code == 200 and reply.json()["complete"]["usage"]["completion_tokens"] == 3
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "3"}
    _assert_400(client.post("/v1/chat/completions", json=chat), "max_tokens")
    _assert_400(client.post("/v1/chat/completions", json={"model": "default"}), "messages")


@pytest.mark.parametrize("sampling,field", [
    ({"max_tokens": 1_000_000_000}, "max_tokens"),
    ({"n": 1000}, "n"),
    ({"logprobs": 1000}, "logprobs"),
    ({"stop": ["x" * 300]}, "stop"),
    ({"stop": ["a"] * 1000}, "stop"),
    ({"stop_token_ids": list(range(1000))}, "stop_token_ids"),
])
def test_r11_caps_refuse_huge_values(rig, client, sampling, field):
    with engine_untouched(rig):
        _assert_400(client.post("/v1/generate", json={"text": "hi", "model_kwargs": {"sampling": sampling}}), field)


def test_r11_ten_thousand_stop_strings_of_10kb_refused_at_the_edge(rig, client):
    """100 MB of stop strings never reaches Python: Envoy answers 413 from its body limit."""
    import psutil

    pre = psutil.Process(rig.child("preprocess").pid)
    rss_before = pre.memory_info().rss
    stop = ["y" * 10_240] * 10_000
    with engine_untouched(rig):
        reply = client.post("/v1/generate", json={"text": "hi", "model_kwargs": {"sampling": {"stop": stop}}})
    assert reply.status_code == 413, (reply.status_code, reply.text[:200])
    assert pre.memory_info().rss - rss_before < 64 * 1024 * 1024


@pytest.mark.parametrize("content,ctype", [
    (b"", "application/json"),
    (b"{", "application/json"),
    (b"[1, 2]", "application/json"),
    (b'"a string"', "application/json"),
    (b"null", "application/json"),
    (b'{"text": "\xff\xfe"}', "application/json"),
    (b'{"text": 5}', "application/json"),
    (b'{"model_kwargs": {"sampling": {"temperature": "hot"}}}', "application/json"),
    (b"\x00\x01\x02binary", "application/json"),
    (b"\x00\x01\x02binary", "application/octet-stream"),
])
def test_r12_malformed_bodies_get_400(rig, client, content, ctype):
    with engine_untouched(rig):
        for path in ("/v1/generate", "/v1/generate_stream", "/v1/chat/completions"):
            reply = client.post(path, content=content, headers={"content-type": ctype})
            want = 415 if ctype != "application/json" else 400  # a non-JSON type: refused at the edge
            assert reply.status_code == want, (path, content, reply.status_code, reply.text[:200])


@pytest.mark.parametrize("request_line", [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/generate HTTP/9.9\r\n\r\n",
    b"POST /v1/generate HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS ClientHello
    b"POST /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
], ids=["garbage", "http-9.9", "negative-length", "chunked-and-length", "tls-hello", "70kb-url", "200-headers"])
def test_r12_raw_request_lines_refused_and_envoy_survives(rig, request_line):
    with socket.create_connection(("127.0.0.1", rig.stack.config.http_port), timeout=5) as s:
        s.sendall(request_line)
        reply = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := s.recv(4096):
                reply += chunk
    status = reply.split(b" ", 2)[1] if reply.startswith(b"HTTP/1.1 ") else b""
    assert not status.startswith(b"5"), reply[:200]
    assert rig.child("envoy").alive()
    rig.check_recovered()


@pytest.mark.parametrize("sampling,field", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "NaN"}, "temperature"),
    ({"temperature": "Infinity"}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"frequency_penalty": "NaN"}, "frequency_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"),
])
def test_r13_impossible_sampling_never_reaches_engine(rig, client, sampling, field):
    with engine_untouched(rig):
        _assert_400(client.post("/v1/generate", json=_sampling(**sampling)), field)
        openai = {"model": "default", "prompt": "hi", "max_tokens": 2}
        if field in ("temperature", "top_p", "frequency_penalty", "presence_penalty"):
            value = sampling[field]
            openai[field] = float(value) if isinstance(value, str) else value
            # NaN/Infinity are not JSON at all: refused as a body error before any field check.
            named = "body" if isinstance(value, str) else field
            _assert_400(client.post("/v1/completions", content=_json_with_nan(openai),
                                    headers={"content-type": "application/json"}), named)


def _json_with_nan(obj: dict) -> bytes:
    import json

    return json.dumps(obj).encode()  # Python writes NaN/Infinity literals: invalid JSON on purpose


@pytest.mark.parametrize("messages", [
    [{"role": "", "content": "hi"}],
    [{"role": "wizard", "content": "hi"}],
    [{"content": "no role at all"}],
])
def test_r10_bad_chat_roles_are_400_not_500(rig, client, messages):
    """Found by the fuzz test: an unknown role escaped as a 500 (UNKNOWN) from the template."""
    with engine_untouched(rig):
        body = {"messages": messages, "model_kwargs": {"sampling": {"max_tokens": 2}}}
        _assert_400(client.post("/v1/generate", json=body), "role")
        chat = {"model": "default", "messages": messages, "max_tokens": 2}
        _assert_400(client.post("/v1/chat/completions", json=chat), "role")


def test_r24_unary_generate_with_open_input_needs_an_id(rig, client):
    """Found by the fuzz test: a unary Generate with an open input and a server-assigned id could
    never be appended to, and held its admission slot until Envoy's idle timeout (300 s)."""
    with engine_untouched(rig):
        reply = client.post("/v1/generate", json={"text": "hi", "input_modalities": ["MODALITY_TEXT"]}, timeout=10)
        _assert_400(reply, "request_id")


@pytest.mark.parametrize("ctype,status", [
    ("text/plain", 415), ("application/x-www-form-urlencoded", 415), ("application/xml", 415),
    ("application/json", 200), ("application/json; charset=utf-8", 200), (None, 200),
])
def test_r12_declared_content_type_is_enforced(client, ctype, status):
    """A JSON body declared as something else is refused at the edge (the transcoder alone would
    parse it anyway); no Content-Type at all stays accepted (curl -X POST without a body)."""
    body = b'{"text": "hi", "model_kwargs": {"sampling": {"max_tokens": 2}}}'
    for path in ("/v1/generate", "/v1/chat/completions"):
        headers = {"content-type": ctype} if ctype else {}
        reply = client.post(path, content=body if path == "/v1/generate" else
                            b'{"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
                            headers=headers)
        assert reply.status_code == status, (path, ctype, reply.status_code, reply.text[:200])
