"""Anthropic Messages: request bodies, the golden event sequence, and the endpoints end to end on the
in-process domain (echo engine: the output is the prompt's own tokens, so it is predictable)."""

from __future__ import annotations

import json

import pytest
from surface_harness import GOLDEN, EchoBackend, collect, http, make_runner, sse_events

from services.common.errors import Code, MstarError, internal
from services.common.finish import FinishReason
from services.preprocess.chat_template import ChatMessage
from services.preprocess.request import Accepted, Chunk, Complete, Failed, KeepAlive, Profile, RequestSpec
from services.preprocess.surfaces.anthropic import errors, render
from services.preprocess.surfaces.anthropic.endpoints import count_tokens, create_message

USER = [{"role": "user", "content": "Say hello."}]


def body(**fields):
    return {"model": "default", "max_tokens": 8, "messages": USER, **fields}


def rejected(req, runner) -> MstarError:
    with pytest.raises(MstarError) as info:
        collect(create_message, req, runner)
    return info.value


def echo_text(runner, messages, max_tokens):
    ids = runner.prompt_token_ids(RequestSpec(messages=tuple(ChatMessage(m["role"], m["content"]) for m in messages)))
    return runner.model.tokenizer.decode(ids[:max_tokens])


# ---- the golden event sequence (renderer only: scripted domain events)


def test_stream_golden_event_sequence():
    out = render.MessageStream("default", 30.0)
    script = [
        Accepted("r1", "", prompt_tokens=9, max_tokens=16),
        KeepAlive("r1"),
        Chunk("r1", 0, "Hello", (1,)),
        Profile("r1", 0.0, 0.0, (), ()),
        Chunk("r1", 1, "", ()),
        Chunk("r1", 2, " there", (2, 3)),
        Complete("r1", FinishReason.STOP_STRING, "\n\n", prompt_tokens=9, cached_prompt_tokens=4, completion_tokens=3, chunks=2),
    ]
    text = b"".join(f.data for e in script for f in out.on_event(e)).decode()
    assert text == (GOLDEN / "anthropic_message_stream.sse").read_text()
    assert out.ended


def test_stream_error_after_start_is_an_error_event_then_the_end_with_the_usage_so_far():
    out = render.MessageStream("m", 30.0)
    out.on_event(Accepted("r", "", 1, 8))
    out.on_event(Chunk("r", 0, "Hi", (5, 6)))
    out.on_event(Chunk("r", 1, "", (7,)))  # a token with no text of its own yet still counts
    frames = out.on_event(Failed("r", MstarError(Code.UNAVAILABLE, "BACKEND_UNAVAILABLE", "backend lost")))
    assert [(e, d) for e, d in sse_events(frames)] == [
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "backend lost"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": None, "stop_sequence": None},
                           "usage": {"output_tokens": 3}}),
        ("message_stop", {"type": "message_stop"})]
    assert out.ended


def test_stream_cancelled_is_an_error_event_then_the_end():
    out = render.MessageStream("m", 30.0)
    out.on_event(Accepted("r", "", 4, 8))
    frames = out.on_event(Complete("r", FinishReason.CANCELLED, "", prompt_tokens=4, cached_prompt_tokens=0,
                                   completion_tokens=2, chunks=1))
    names = [e for e, _ in sse_events(frames)]
    assert names == ["error", "content_block_stop", "message_delta", "message_stop"]
    assert sse_events(frames)[2][1]["usage"] == {"output_tokens": 2}


@pytest.mark.parametrize(("reason", "stop", "expected"), [
    (FinishReason.END, "", "end_turn"), (FinishReason.STOP_STRING, "END", "stop_sequence"),
    (FinishReason.LENGTH, "", "max_tokens")])
def test_stop_reasons(reason, stop, expected):
    msg = render.message("msg_x", "m", "t", Complete("x", reason, stop, 5, 2, 1, 1))
    assert msg["stop_reason"] == expected and msg["stop_sequence"] == (stop or None)
    assert msg["usage"] == {"input_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2,
                            "output_tokens": 1}


def test_error_object_shape():
    assert errors.error_object(internal("boom")) == {"type": "error", "error": {"type": "api_error",
                                                                               "message": "boom"}}


# ---- endpoints on the in-process domain


def test_non_stream_message(runner):
    frames = collect(create_message, http(body()), runner)
    assert len(frames) == 1 and frames[0].content_type == "application/json"
    msg = json.loads(frames[0].data)
    assert msg["type"] == "message" and msg["role"] == "assistant" and msg["id"].startswith("msg_")
    assert msg["content"] == [{"type": "text", "text": echo_text(runner, USER, 8)}]
    assert msg["stop_reason"] == "max_tokens" and msg["usage"]["output_tokens"] == 8
    assert dict(frames[0].headers)["x-mstar-completion-tokens"] == "8"


def test_stream_concatenates_to_the_non_stream_text(runner):
    events = sse_events(collect(create_message, http(body(stream=True)), runner))
    names = [e for e, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(d["delta"]["text"] for e, d in events if e == "content_block_delta")
    assert text == echo_text(runner, USER, 8)
    delta = next(d for e, d in events if e == "message_delta")
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 8


def test_stop_sequences_end_with_stop_sequence(runner):
    full = echo_text(runner, USER, 64)
    word = "user"  # the chat template writes the role name: the echo will hit it
    assert word in full
    frames = collect(create_message, http(body(max_tokens=64, stop_sequences=["zzz", word])), runner)
    msg = json.loads(frames[0].data)
    assert msg["stop_reason"] == "stop_sequence" and msg["stop_sequence"] == word
    assert msg["content"][0]["text"] == full[: full.index(word)]


def test_system_as_string_or_blocks_and_content_blocks(runner):
    a = collect(create_message, http(body(system="Be brief.")), runner)[0].data
    b = collect(create_message, http(body(system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
                                           messages=[{"role": "user", "content": [
                                               {"type": "text", "text": "Say hello."}]}])), runner)[0].data
    assert json.loads(a)["content"] == json.loads(b)["content"]


@pytest.mark.parametrize(("fields", "field", "reason"), [
    ({"max_tokens": None}, "max_tokens", "INVALID_FIELD"),
    ({"max_tokens": 0}, "max_tokens", "INVALID_FIELD"),
    ({"temperature": "hot"}, "temperature", "INVALID_FIELD"),
    ({"stop_sequences": ["a", "b", 3]}, "stop_sequences[2]", "INVALID_FIELD"),
    ({"top_k": -1}, "top_k", "INVALID_FIELD"),
    ({"seed": 3}, "seed", "UNKNOWN_FIELD"),
    ({"tools": [{"name": "x"}]}, "tools[0].input_schema", "INVALID_FIELD"),
    ({"tools": [{"name": "x", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "y"}}, "tool_choice.name",
     "INVALID_FIELD"),
    ({"tool_choice": {"type": "any"}}, "tool_choice", "INVALID_FIELD"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "2"}]}]},
     "messages[0].content[0].tool_use_id", "INVALID_FIELD"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "messages[0].content[0]", "INVALID_FIELD"),
    ({"messages": []}, "messages", "INVALID_FIELD"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", "INVALID_FIELD"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].source", "INVALID_FIELD"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0]",
     "UNSUPPORTED_FIELD"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "INVALID_FIELD"),
    ({"messages": USER + [{"role": "assistant", "content": "Sure"}]}, "messages[1].role", "INVALID_FIELD"),
])
def test_bad_bodies_name_the_field_as_sent(runner, fields, field, reason):
    fields = {k: v for k, v in fields.items()}
    sent = body(**fields)
    if fields.get("max_tokens", 1) is None:
        del sent["max_tokens"]
    err = rejected(http(sent), runner)
    assert err.code == Code.INVALID_ARGUMENT and err.field_violations[0].field == field and err.reason == reason


def test_neutral_unsupported_values_and_ignored_fields_pass(runner):
    collect(create_message, http(body(tools=[], tool_choice={"type": "auto"}, thinking={"type": "disabled"},
                                      metadata={"user_id": "u"}, service_tier="auto")), runner)


def test_version_header_is_checked_when_sent(runner):
    collect(create_message, http(body(), **{"anthropic-version": "2023-06-01"}), runner)
    err = rejected(http(body(), **{"anthropic-version": "latest"}), runner)
    assert err.field_violations[0].field == "anthropic-version"


def test_unknown_model_is_404(runner):
    assert rejected(http(body(model="claude-opus")), runner).code == Code.NOT_FOUND


def test_count_tokens_is_the_prompt_a_message_would_run(model):
    runner = make_runner(model)
    frames = collect(count_tokens, http({"model": "default", "messages": USER, "system": "Be brief."}), runner)
    counted = json.loads(frames[0].data)["input_tokens"]
    msg = json.loads(collect(create_message, http(body(system="Be brief.")), runner)[0].data)
    assert counted == msg["usage"]["input_tokens"] + msg["usage"]["cache_read_input_tokens"] > 0
    assert runner.deps.backend.started == [runner.deps.backend.started[0]]  # counting ran nothing


def test_pings_keep_a_queued_stream_alive(model):
    runner = make_runner(model, EchoBackend(step_s=0.05))
    runner.deps.keepalive_s = 0.01
    events = sse_events(collect(create_message, http(body(stream=True, max_tokens=2)), runner))
    names = [e for e, _ in events]
    assert names.count("ping") > 1 and names[-1] == "message_stop"
