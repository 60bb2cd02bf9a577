"""Structured output and tool calls on the HTTP surfaces (in-process domain, echo engine): what
each body becomes on the internal stream, bad input named as the client sent it, tool calls
rendered as OpenAI and Anthropic shapes (streamed and not), and engine errors renamed."""

from __future__ import annotations

import json

import pytest
from surface_harness import EchoBackend, collect, http, make_runner, sse_events

from services.common.errors import Code, MstarError, invalid_argument, renamed
from services.common.finish import FinishReason
from services.preprocess import tools
from services.preprocess.request import Accepted, Chunk, Complete
from services.preprocess.surfaces.anthropic import render as anthropic_render
from services.preprocess.surfaces.anthropic.endpoints import create_message
from services.preprocess.surfaces.openai import endpoints
from services.preprocess.surfaces.openai.choices import Choices

ASK = [{"role": "user", "content": "Weather in Paris?"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
TIME = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture
def backend():
    return EchoBackend()


@pytest.fixture
def echo_runner(model, backend):
    return make_runner(model, backend)


def chat(runner, **fields):
    return collect(endpoints.chat_completions, http({"model": "default", "messages": ASK, "max_tokens": 2, **fields}),
                   runner)


def field_of(runner, fn=chat, **fields) -> str:
    with pytest.raises(MstarError) as info:
        fn(runner, **fields)
    assert info.value.code == Code.INVALID_ARGUMENT, info.value
    return info.value.field_violations[0].field


def sent(backend):
    return backend.sampling[-1].structured_output


def test_each_body_field_becomes_the_constraint_on_the_internal_stream(echo_runner, backend):
    chat(echo_runner, response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}})
    assert json.loads(sent(backend).json_schema) == SCHEMA
    chat(echo_runner, response_format={"type": "json_object"})
    assert sent(backend).json_object
    chat(echo_runner, response_format={"type": "text"})
    assert not backend.sampling[-1].HasField("structured_output")
    chat(echo_runner, tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}},
         parallel_tool_calls=False)
    calls = sent(backend).tool_calls
    assert [t.begin for t in calls.tags] == [tools.begin("get_time")] and calls.require_call and calls.single_call
    chat(echo_runner, tools=[WEATHER, TIME])  # auto
    assert len(sent(backend).tool_calls.tags) == 2 and not sent(backend).tool_calls.require_call
    chat(echo_runner, tools=[WEATHER], tool_choice="none")
    assert not backend.sampling[-1].HasField("structured_output")
    for name, value, kind in [("guided_json", SCHEMA, "json_schema"), ("guided_json", json.dumps(SCHEMA), "json_schema"),
                              ("guided_regex", "[a-z]+", "regex"), ("guided_choice", ["a", "b"], "choice"),
                              ("guided_grammar", 'root ::= "x"', "grammar")]:
        collect(endpoints.completions, http({"prompt": "x", "max_tokens": 1, name: value}), echo_runner)
        assert sent(backend).WhichOneof("kind") == kind
    collect(create_message, http({"model": "default", "max_tokens": 2, "messages": ASK, "tool_choice": {"type": "any"},
                                  "tools": [{"name": "get_weather", "input_schema": SCHEMA}]}), echo_runner)
    assert sent(backend).tool_calls.require_call


def test_bad_input_names_the_clients_field(echo_runner):
    deep = {"type": "object", "properties": {"a": SCHEMA}}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    assert field_of(echo_runner, response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": deep}}) \
        == "response_format.json_schema.schema"
    assert field_of(echo_runner, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}) \
        == "tool_choice.function.name"
    assert field_of(echo_runner, tool_choice="required") == "tool_choice"
    assert field_of(echo_runner, tools=[WEATHER, WEATHER]) == "tools"
    assert field_of(echo_runner, messages=[*ASK, {"role": "tool", "tool_call_id": "call_1", "content": "x"}]) \
        == "messages[1].tool_call_id"
    bad_args = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                     "function": {"name": "f", "arguments": "{oops"}}]}
    assert field_of(echo_runner, messages=[*ASK, bad_args]) == "messages[1].tool_calls[0].function.arguments"
    assert field_of(echo_runner, response_format={"type": "json_object"}, guided_regex="a") == "guided_regex"
    assert field_of(echo_runner, tools=[WEATHER], response_format={"type": "json_object"}) == "response_format"
    assert field_of(echo_runner, tools=[WEATHER], tool_choice="required", parallel_tool_calls="no") \
        == "parallel_tool_calls"


def test_a_history_with_calls_and_results_is_accepted(echo_runner, backend):
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    chat(echo_runner, tools=[WEATHER], messages=[*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                                                 {"role": "tool", "tool_call_id": "call_9", "content": "21 C"}])
    assert len(backend.started) == 1


def test_engine_errors_are_renamed_to_the_clients_field():
    renames = tools.field_renames([tools.Tool("a"), tools.Tool("b")], "b")
    err = renamed(invalid_argument("structured_output.tool_calls.tags[0].json_schema", "does not compile: x",
                                   reason="INVALID_GRAMMAR"), renames)
    assert err.field_violations[0].field == "tools[1].function.parameters" == err.metadata["field"]
    assert err.message == "tools[1].function.parameters: does not compile: x" and err.reason == "INVALID_GRAMMAR"
    other = renamed(invalid_argument("structured_output", "dead end"), renames)
    assert other.field_violations[0].field == "tools"
    untouched = invalid_argument("temperature", "bad")
    assert renamed(untouched, renames) is untouched


CALL = tools.begin("get_weather") + '{"city": "Paris"}' + tools.END


def script(pieces, finish=FinishReason.END):
    return [Accepted("r1", "", 9, 16), *(Chunk("r1", i, p, (i,)) for i, p in enumerate(pieces)),
            Complete("r1", finish, "", prompt_tokens=9, cached_prompt_tokens=0, completion_tokens=len(pieces),
                     chunks=len(pieces))]


def run_choices(stream, pieces, finish=FinishReason.END):
    out = Choices(chat=True, n=1, stream=stream, include_usage=False, logprobs=False, model="m",
                  token_text=str, token_bytes=bytes, keepalive_s=30.0, tool_calls=True)
    frames = [f for e in script(pieces, finish) for f in out.on_event(0, e)] + out.end()
    return sse_events(frames) if stream else json.loads(frames[0].data)


def test_openai_tool_calls_streamed_and_not():
    pieces = ["Sure. <tool", "_call>\n{\"name\": \"get_weather\", ", '"arguments": {"city": "Paris"}', "}\n</tool_call>"]
    assert "".join(pieces) == "Sure. " + CALL
    whole = run_choices(False, pieces)["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] == "Sure. "
    (call,) = whole["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert call["type"] == "function" and call["id"].startswith("call_")
    chunks = [d["choices"][0] for _, d in run_choices(True, pieces)[:-1]]
    assert "".join(c["delta"].get("content") or "" for c in chunks) == "Sure. "
    fragments = [t for c in chunks for t in c["delta"].get("tool_calls", [])]
    assert fragments[0]["id"].startswith("call_") and fragments[0]["function"]["name"] == "get_weather"
    assert "".join(f["function"]["arguments"] for f in fragments) == '{"city": "Paris"}'
    assert chunks[-1]["finish_reason"] == "tool_calls"
    # A call cut by max_tokens is text, and the finish reason stays "length".
    cut = run_choices(True, ["<tool_call>\n{\"name\": "], finish=FinishReason.LENGTH)
    assert cut[-2][1]["choices"][0]["finish_reason"] == "length"
    assert "".join(d["choices"][0]["delta"].get("content") or "" for _, d in cut[:-1]) == "<tool_call>\n{\"name\": "


def test_anthropic_tool_use_blocks_streamed_and_not():
    done = script([])[-1]
    msg = anthropic_render.message("msg_1", "m", "Sure. " + CALL, done, tool_calls=True)
    assert msg["stop_reason"] == "tool_use"
    assert msg["content"][0] == {"type": "text", "text": "Sure. "}
    assert msg["content"][1]["type"] == "tool_use" and msg["content"][1]["input"] == {"city": "Paris"}
    assert msg["content"][1]["id"].startswith("toolu_")
    out = anthropic_render.MessageStream("m", 30.0, tool_calls=True)
    frames = [f for e in script(["Sure. ", CALL]) for f in out.on_event(e)]
    events = [d for _, d in sse_events(frames) if d["type"] != "ping"]
    kinds = [(e["type"], e.get("index")) for e in events]
    assert kinds == [("message_start", None), ("content_block_start", 0), ("content_block_delta", 0),
                     ("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1),
                     ("content_block_stop", 1), ("message_delta", None), ("message_stop", None)]
    assert events[5]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_responses_function_call_items_streamed_and_not():
    from services.preprocess.surfaces.responses.render import ResponseState, ResponseStream

    def state():
        return ResponseState(id="resp_1", item_id="msg_1", created_at=0, model="m", instructions=None,
                             max_output_tokens=None, temperature=None, top_p=None, store=False,
                             previous_response_id=None, metadata={}, parser=tools.CallStream())

    s = state()
    out = ResponseStream(s, 30.0)
    frames = out.start() + out.delta("Sure. ") + out.delta(CALL)
    s.finish(script([])[-1])
    events = [d for _, d in sse_events(frames + out.end())]
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["message", "function_call"]
    assert output[0]["content"][0]["text"] == "Sure. "
    assert output[1]["name"] == "get_weather" and json.loads(output[1]["arguments"]) == {"city": "Paris"}
    assert output[1]["call_id"].startswith("call_") and events[5]["output_index"] == 1
    only_call = state()
    ResponseStream(only_call, 30.0).delta(CALL)
    only_call.finish(script([])[-1])
    assert [o["type"] for o in only_call.object()["output"]] == ["function_call"]


def test_responses_tools_and_call_outputs(echo_runner, backend, tmp_path):
    import asyncio

    from services.preprocess.surfaces.responses.endpoints import ResponsesApi
    from services.preprocess.surfaces.responses.store import ResponseStore

    store = asyncio.run(ResponseStore(tmp_path / "r.sqlite3").open())
    api = ResponsesApi(store)
    try:
        fn = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
        collect(api.create, http({"input": "Weather?", "max_output_tokens": 2, "tools": [fn],
                                  "tool_choice": "required"}), echo_runner)
        assert sent(backend).tool_calls.require_call
        collect(api.create, http({"input": "A city", "max_output_tokens": 2, "text": {"format": {
            "type": "json_schema", "name": "c", "schema": SCHEMA}}}), echo_runner)
        assert json.loads(sent(backend).json_schema) == SCHEMA
        history = [{"role": "user", "content": "Weather?"},
                   {"type": "function_call", "call_id": "call_7", "name": "get_weather", "arguments": '{"city": "X"}'},
                   {"type": "function_call_output", "call_id": "call_7", "output": "21 C"}]
        collect(api.create, http({"input": history, "max_output_tokens": 2, "tools": [fn]}), echo_runner)
        with pytest.raises(MstarError) as info:
            collect(api.create, http({"input": history[:1] + history[2:], "max_output_tokens": 2}), echo_runner)
        assert info.value.field_violations[0].field == "input[1].call_id"
    finally:
        asyncio.run(store.close())
