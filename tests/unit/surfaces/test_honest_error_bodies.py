"""Issue 28, honest errors, on the real request runner, tokenizer and chat template of the default
model in front of the echo engine (surface_harness.py): an error names the field the client sent
(an alias, a schema nested too deep in any schema-carrying field), a clamp is reported by every
HTTP surface as a Warning header (http_routes.py), an output modality the model cannot produce is
refused, and a large embeddings body is sent in frames."""

import asyncio
import json

import pytest
from google.api import httpbody_pb2
from surface_harness import EchoBackend, collect, http, make_runner

from services.common.errors import MstarError
from services.preprocess.http_routes import HttpRoutes, warning_headers
from services.preprocess.surfaces.anthropic import endpoints as anthropic
from services.preprocess.surfaces.openai import embeddings
from services.preprocess.surfaces.openai import endpoints as openai
from services.preprocess.surfaces.responses.endpoints import ResponsesApi
from services.preprocess.surfaces.responses.store import ResponseStore

USER = [{"role": "user", "content": "hi"}]


def deep_schema(levels: int) -> dict:
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def refusal(endpoint, body, runner) -> MstarError:
    with pytest.raises(MstarError) as info:
        collect(endpoint, http(body), runner)
    return info.value


def field(err: MstarError) -> str:
    return err.field_violations[0].field


# ---- an alias is named as sent


@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
def test_a_chat_max_tokens_over_the_cap_is_named_as_sent(runner, name):
    err = refusal(openai.chat_completions, {"messages": USER, name: 100_000}, runner)
    assert field(err) == name and err.message.startswith(f"{name}: must be in [1, 8192]")


def test_two_spellings_of_one_field_must_agree(runner):
    err = refusal(openai.chat_completions, {"messages": USER, "max_tokens": 5, "max_completion_tokens": 6}, runner)
    assert field(err) == "max_tokens" and "conflicts with max_completion_tokens" in err.message
    frames = collect(openai.chat_completions, http({"messages": USER, "max_tokens": 3, "max_completion_tokens": 3}),
                     runner)
    assert json.loads(frames[-1].data)["usage"]["completion_tokens"] == 3


def test_each_surface_names_its_own_max_tokens(runner, model):
    assert field(refusal(openai.completions, {"prompt": "hi", "max_tokens": 9000}, runner)) == "max_tokens"
    api = ResponsesApi(ResponseStore(":memory:"))
    assert field(refusal(api.create, {"input": "hi", "max_output_tokens": 9000}, runner)) == "max_output_tokens"
    body = {"model": "default", "messages": USER, "max_tokens": 9000}
    assert field(refusal(anthropic.create_message, body, runner)) == "max_tokens"


# ---- a schema nested too deep: its field and the structured-output cap, in every schema field


DEEP = deep_schema(100)  # 201 JSON levels: past the fast parser's limit, inside the body's


@pytest.mark.parametrize(("surface", "body", "name"), [
    ("chat", {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": DEEP}}},
     "response_format.json_schema.schema"),
    ("chat", {"messages": USER, "guided_json": DEEP}, "guided_json"),
    ("chat", {"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]},
     "tools[0].function.parameters"),
    ("completions", {"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"schema": DEEP}}},
     "response_format.json_schema.schema"),
    ("messages", {"model": "default", "max_tokens": 4, "messages": USER, "tools": [
        {"name": "ok", "input_schema": {"type": "object"}}, {"name": "f", "input_schema": DEEP}]},
     "tools[1].input_schema"),
    ("responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": DEEP}}},
     "text.format.schema"),
    ("responses", {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": DEEP}]},
     "tools[0].parameters"),
])
def test_a_deep_schema_is_refused_naming_its_field_and_the_cap(runner, surface, body, name):
    endpoint = {"chat": openai.chat_completions, "completions": openai.completions,
                "messages": anthropic.create_message,
                "responses": ResponsesApi(ResponseStore(":memory:")).create}[surface]
    err = refusal(endpoint, body, runner)
    assert field(err) == name, err.message
    assert "nests too deep" in err.message and "the limit is 32" in err.message


def test_a_body_past_the_body_limit_is_refused_as_a_whole(runner):
    body = b'{"messages": [{"role": "user", "content": "hi"}], "metadata": ' + b"[" * 600 + b"]" * 600 + b"}"
    err = refusal(openai.chat_completions, body, runner)
    assert field(err) == "body" and err.reason == "BODY_TOO_DEEP"


def test_tool_call_arguments_nested_past_the_parser_are_a_400(runner):
    messages = [*USER, {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f",
                "arguments": "[" * 100_000}}]}, {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    err = refusal(openai.chat_completions, {"messages": messages}, runner)
    assert field(err) == "messages[1].tool_calls[0].function.arguments"
    items = [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{" * 100_000}]
    err = refusal(ResponsesApi(ResponseStore(":memory:")).create, {"input": items}, runner)
    assert field(err) == "input[0].arguments"


# ---- output modalities


def test_chat_modalities_other_than_text_are_refused_naming_the_entry(runner):
    err = refusal(openai.chat_completions, {"messages": USER, "modalities": ["text", "audio"]}, runner)
    assert field(err) == "modalities[1]" and err.reason == "UNSUPPORTED_FIELD" and "audio" in err.message
    assert collect(openai.chat_completions, http({"messages": USER, "modalities": ["text"], "max_tokens": 1}), runner)


# ---- a clamp is reported as a Warning header on every HTTP surface


class Context:
    """What http_routes uses of a grpc.aio context."""

    def __init__(self) -> None:
        self.headers: list[tuple[str, str]] | None = None

    def invocation_metadata(self):
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def add_done_callback(self, callback) -> None:
        pass

    def time_remaining(self):
        return None

    async def send_initial_metadata(self, metadata) -> None:
        assert self.headers is None, "initial metadata sent twice"
        self.headers = list(metadata)


class Routes(HttpRoutes):
    def __init__(self, runner) -> None:
        self.runner = runner
        self.responses = ResponsesApi(ResponseStore(":memory:"))
        self.created = 0


def served(runner, rpc: str, body: dict) -> tuple[list[tuple[str, str]], bytes]:
    async def go():
        context = Context()
        call = getattr(Routes(runner), rpc)(httpbody_pb2.HttpBody(data=json.dumps(body).encode(),
                                                                  content_type="application/json"), context)
        data = b"".join([f.data async for f in call]) if hasattr(call, "__aiter__") else (await call).data
        return context.headers or [], data

    return asyncio.run(go())


@pytest.mark.parametrize(("rpc", "body", "name"), [
    ("CreateChatCompletion", {"messages": USER, "max_tokens": 8192}, "max_tokens"),
    ("CreateChatCompletion", {"messages": USER, "max_completion_tokens": 8192, "stream": True}, "max_completion_tokens"),
    ("CreateCompletion", {"prompt": "hi", "max_tokens": 8192}, "max_tokens"),
    ("CreateMessage", {"model": "default", "messages": USER, "max_tokens": 8192, "stream": True}, "max_tokens"),
    ("CreateModelResponse", {"input": "hi", "max_output_tokens": 8192, "store": False}, "max_output_tokens"),
])
def test_every_surface_sends_the_clamp_as_a_warning_header(model, rpc, body, name):
    runner = make_runner(model, EchoBackend())
    headers, data = served(runner, rpc, body)
    warnings = [v for k, v in headers if k == "warning"]
    assert len(warnings) == 1 and warnings[0].startswith(f'299 - "{name} clamped to '), headers
    assert data


def test_no_clamp_no_warning(model):
    headers, _ = served(make_runner(model, EchoBackend()), "CreateChatCompletion", {"messages": USER, "max_tokens": 2})
    assert not [k for k, _ in headers if k == "warning"]


def test_warning_text_is_a_quoted_string():
    assert warning_headers(['a "b" \\ c', "é"]) == (("warning", '299 - "a \\"b\\" \\\\ c"'), ("warning", '299 - "?"'))


# ---- embeddings: a large body in frames


def test_a_large_embeddings_body_is_sent_in_frames_that_join_into_one_document(model, monkeypatch):
    monkeypatch.setattr(embeddings, "FRAME_BYTES", 2000)
    runner = make_runner(model, EchoBackend())
    frames = collect(embeddings.create_embedding, http({"input": [f"text {i}" for i in range(300)]}), runner)
    assert len(frames) > 10 and all(len(f.data) < 2000 + 500 for f in frames)
    body = json.loads(b"".join(f.data for f in frames))
    assert [d["index"] for d in body["data"]] == list(range(300)) and body["usage"]["prompt_tokens"] > 300
    assert list(body) == ["object", "data", "model", "usage"]
