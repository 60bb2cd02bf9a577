"""OpenAI chat/completions on the in-process domain (echo engine): bodies, SSE, usage, n, logprobs,
errors before and after the first byte, and /v1/models."""

from __future__ import annotations

import asyncio
import json

import pytest
from surface_harness import GOLDEN, EchoBackend, collect, http, make_runner, sse_events

from services.common.errors import Code, MstarError
from services.common.finish import FinishReason
from services.preprocess.chat_template import ChatMessage
from services.preprocess.request import Accepted, Chunk, Complete, KeepAlive, RequestSpec
from services.preprocess.surfaces.http import HttpRequest
from services.preprocess.surfaces.openai import endpoints
from services.preprocess.surfaces.openai.choices import Choices

MSG = [{"role": "user", "content": "hi"}]


def chat(runner, **fields):
    frames = collect(endpoints.chat_completions, http({"model": "default", "messages": MSG, **fields}), runner)
    return sse_events(frames) if fields.get("stream") else json.loads(frames[0].data)


def completion(runner, **fields):
    frames = collect(endpoints.completions, http({"model": "default", "prompt": "Once upon", **fields}), runner)
    return sse_events(frames) if fields.get("stream") else json.loads(frames[0].data)


def rejected(fn, runner, **fields) -> MstarError:
    with pytest.raises(MstarError) as info:
        fn(runner, **fields)
    assert info.value.code == Code.INVALID_ARGUMENT and info.value.http_status == 400
    return info.value


def field_of(err: MstarError) -> str:
    return err.field_violations[0].field


def echo(runner, n):
    ids = runner.prompt_token_ids(RequestSpec(messages=(ChatMessage("user", "hi"),)))
    return runner.model.tokenizer.decode(ids[:n])


def test_chat_stream_concatenates_to_non_stream_with_usage(runner):
    whole = chat(runner, max_tokens=5)
    assert whole["object"] == "chat.completion" and whole["id"].startswith("chatcmpl-")
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": echo(runner, 5)}
    assert whole["choices"][0]["finish_reason"] == "length"
    usage = whole["usage"]
    timings = usage.pop("mstar_timings")
    assert usage["completion_tokens"] == 5 and usage["prompt_tokens_details"] == {"cached_tokens": 1}
    assert len(timings) == 1 and set(timings[0]) >= {"queue_ms", "e2e_ms"}
    events = chat(runner, max_tokens=5, stream=True, stream_options={"include_usage": True})
    assert events[-1] == (None, "[DONE]")
    chunks = [d for _, d in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == echo(runner, 5)
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_keepalive_comments_while_waiting(model):
    runner = make_runner(model, EchoBackend(step_s=0.05))
    runner.deps.keepalive_s = 0.01
    events = chat(runner, max_tokens=2, stream=True)
    assert (":", ": keep-alive") in events


def test_completions_text_and_token_prompt_and_default_max_tokens(runner):
    reply = completion(runner)
    assert reply["object"] == "text_completion" and reply["usage"]["completion_tokens"] <= 16
    ids = runner.model.tokenizer.encode("Once upon")
    by_ids = completion(runner, prompt=ids)
    assert by_ids["choices"][0]["text"] == reply["choices"][0]["text"] == "Once upon"
    assert completion(runner, prompt=[ids])["choices"][0]["text"] == "Once upon"


def test_n_choices_with_distinct_seeds(model):
    backend = EchoBackend()
    runner = make_runner(model, backend)
    reply = chat(runner, max_tokens=3, n=3, seed=2**63 - 2)
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2] and reply["usage"]["completion_tokens"] == 9
    assert len(backend.started) == 3


def test_logprobs(runner):
    reply = chat(runner, max_tokens=2, logprobs=True, top_logprobs=1)
    content = reply["choices"][0]["logprobs"]["content"]
    assert len(content) == 2 and content[0]["logprob"] == -0.5 and len(content[0]["top_logprobs"]) == 1
    ids = runner.prompt_token_ids(RequestSpec(messages=(ChatMessage("user", "hi"),)))  # what the echo sends
    assert [c["bytes"] for c in content] == [list(runner.model.tokenizer.token_bytes(t)) for t in ids[:2]]
    lp = completion(runner, max_tokens=2, logprobs=2)["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [-0.5, -0.5] and lp["text_offset"][0] == 0


@pytest.mark.parametrize(("name", "value", "field"), [
    ("stop", ["ok", 3], "stop[1]"), ("stop", 5, "stop"), ("max_tokens", "256", "max_tokens"),
    ("max_tokens", True, "max_tokens"), ("max_tokens", 1.5, "max_tokens"), ("temperature", "1", "temperature"),
    ("n", 1.0, "n"), ("seed", 2**64, "seed"), ("stream", "yes", "stream"), ("model", 3, "model"),
    ("stop_token_ids", [1, -1], "stop_token_ids[1]"), ("messages", [], "messages"),
    ("messages", [{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
    ("messages", [{"role": "critic", "content": "x"}], "messages[0].role"),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
     "messages[0].content[0].image_url.url"),
    ("messages", [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "messages[0].content[0]"),
    ("messages", [{"role": "user"}], "messages[0].content"),
])
def test_bad_fields_are_named_as_sent(runner, name, value, field):
    assert field_of(rejected(chat, runner, **{name: value})) == field


def test_unknown_unsupported_ignored(runner):
    err = rejected(chat, runner, max_token=3)
    assert err.reason == "UNKNOWN_FIELD" and field_of(err) == "max_token"
    err = rejected(chat, runner, functions=[{"name": "f"}])
    assert err.reason == "UNSUPPORTED_FIELD" and field_of(err) == "functions"
    chat(runner, max_tokens=1, tools=[], tool_choice="none", response_format={"type": "text"}, user="u",
         metadata={"a": 1}, store=False, parallel_tool_calls=True)
    err = rejected(completion, runner, best_of=3)
    assert err.reason == "UNSUPPORTED_FIELD" and field_of(err) == "best_of"
    assert field_of(rejected(chat, runner, top_logprobs=2)) == "top_logprobs"
    assert field_of(rejected(chat, runner, max_tokens=3, max_completion_tokens=4)) == "max_tokens"


def test_stop_string_and_empty_stops_dropped(runner):
    full = echo(runner, 64)
    reply = chat(runner, max_tokens=64, stop=["", "user"])
    assert reply["choices"][0]["message"]["content"] == full[: full.index("user")]
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_failure_after_first_byte_is_in_band_and_before_is_a_status(model):
    runner = make_runner(model, EchoBackend(fail_after=2))
    events = chat(runner, max_tokens=8, stream=True)
    assert events[-2][1] == {"error": {"message": "engine lost", "type": "service_unavailable_error",
                                       "code": "backend_unavailable", "param": None}}
    assert events[-1] == (None, "[DONE]")
    with pytest.raises(MstarError) as info:
        chat(runner, max_tokens=8)
    assert info.value.code == Code.UNAVAILABLE


def test_client_disconnect_closes_every_choice(model):
    backend = EchoBackend(step_s=0.01, hold=True)
    runner = make_runner(model, backend)

    async def go():
        scope = runner.scope()
        stream = endpoints.completions(http({"prompt": "x", "stream": True, "n": 3, "max_tokens": 100}), scope)
        for _ in range(3):
            await anext(stream)
        await stream.aclose()  # what grpc does when the client goes away
        return runner.num_running

    assert asyncio.run(go()) == 0 and len(backend.aborted) == 3


def test_models_list_and_retrieve(runner):
    listed = json.loads(collect(endpoints.list_models, HttpRequest(), runner, 123)[0].data)
    assert listed["object"] == "list" and listed["data"][0]["created"] == 123
    name = listed["data"][0]["id"]
    one = json.loads(collect(endpoints.retrieve_model, HttpRequest(params={"model": name}), runner, 123)[0].data)
    assert one == listed["data"][0]
    with pytest.raises(MstarError) as info:
        collect(endpoints.retrieve_model, HttpRequest(params={"model": "gpt-4"}), runner, 123)
    assert info.value.code == Code.NOT_FOUND
    assert "numerics" not in listed["data"][0]  # no generation backend has connected yet


def test_models_report_the_backends_numerics(runner):
    numerics = {"device": "cpu", "weights": "Q4_1 codes x210", "activations": "float32", "kernels": "cpu",
                "compiled_decode": True}
    runner.deps.backend.numerics = numerics  # what backend._numerics keeps from the Stream's metadata
    listed = json.loads(collect(endpoints.list_models, HttpRequest(), runner, 123)[0].data)
    assert listed["data"][0]["numerics"] == numerics


def test_chat_stream_golden_event_sequence():


    out = Choices(chat=True, n=1, stream=True, include_usage=True, logprobs=False, model="default",
                  token_text=str, token_bytes=bytes, keepalive_s=30.0)
    out.env.created = 1700000000
    script = [Accepted("r1", "", 9, 16), KeepAlive("r1"), Chunk("r1", 0, "Hello", (1,)), Chunk("r1", 1, " there", (2,)),
              Complete("r1", FinishReason.END, "", prompt_tokens=9, cached_prompt_tokens=4, completion_tokens=2, chunks=2,
                       timings_ms={"e2e_ms": 5.0})]
    frames = [f for e in script for f in out.on_event(0, e)] + out.end()
    assert b"".join(f.data for f in frames).decode() == (GOLDEN / "openai_chat_stream.sse").read_text()
