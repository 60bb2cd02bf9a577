"""OpenAI Responses: the golden event sequence, the endpoints on the in-process domain (echo engine),
conversation state through the SQLite store, cancel."""

from __future__ import annotations

import asyncio
import json

import pytest
from surface_harness import GOLDEN, EchoBackend, collect, http, make_runner, sse_events

from services.common.errors import Code, MstarError
from services.common.finish import FinishReason
from services.preprocess.chat_template import ChatMessage
from services.preprocess.request import Complete, RequestSpec
from services.preprocess.surfaces.http import HttpRequest
from services.preprocess.surfaces.responses.endpoints import ResponsesApi
from services.preprocess.surfaces.responses.render import ResponseState, ResponseStream
from services.preprocess.surfaces.responses.store import ResponseStore


@pytest.fixture
def api(tmp_path):
    store = asyncio.run(ResponseStore(tmp_path / "responses.sqlite3").open())
    yield ResponsesApi(store)
    asyncio.run(store.close())


def create(api, runner, **fields) -> dict | list:
    frames = collect(api.create, http({"model": "default", "max_output_tokens": 6, **fields}), runner)
    return sse_events(frames) if fields.get("stream") else json.loads(frames[0].data)


def call(endpoint, runner, response_id: str) -> dict:
    frames = collect(endpoint, HttpRequest(params={"response_id": response_id}), runner)
    return json.loads(frames[0].data)


def echo(runner, messages, n):
    spec = RequestSpec(messages=tuple(ChatMessage(r, c) for r, c in messages))
    return runner.model.tokenizer.decode(runner.prompt_token_ids(spec)[:n])


def test_stream_golden_event_sequence():
    state = ResponseState("resp_r1", "msg_r1", 1700000000, "default", "Be brief.", 16, 0.0, None, True, None,
                          {"k": "v"})
    out = ResponseStream(state, 30.0)
    frames = out.start() + out.delta("Hello") + out.delta(" there")
    state.finish(Complete("r1", FinishReason.END, "", prompt_tokens=9, cached_prompt_tokens=4, completion_tokens=3, chunks=2))
    frames += out.end()
    assert b"".join(f.data for f in frames).decode() == (GOLDEN / "responses_stream.sse").read_text()


def test_non_stream_completed_and_incomplete(api, runner):
    short = create(api, runner, input="Hi", max_output_tokens=200)
    assert short["status"] == "completed" and short["object"] == "response" and short["id"].startswith("resp_")
    text = short["output"][0]["content"][0]["text"]
    assert text == echo(runner, [("user", "Hi")], 200)
    assert short["usage"]["input_tokens"] == short["usage"]["output_tokens"]  # the echo engine
    cut = create(api, runner, input="Hi")
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut["usage"]["output_tokens"] == 6 and cut["usage"]["input_tokens_details"] == {"cached_tokens": 1}


def test_stream_deltas_equal_the_non_stream_text_and_events_are_numbered(api, runner):
    whole = create(api, runner, input="Hi")
    events = create(api, runner, input="Hi", stream=True)
    names = [e for e, _ in events if e != ":"]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    data = [d for e, d in events if e != ":"]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert all(d["type"] == e for e, d in events if e != ":")
    deltas = "".join(d["delta"] for d in data if d["type"] == "response.output_text.delta")
    assert deltas == whole["output"][0]["content"][0]["text"]


def test_store_retrieve_delete_and_store_false(api, runner):
    kept = create(api, runner, input="Hi", metadata={"a": "b"})
    assert call(api.retrieve, runner, kept["id"]) == kept
    gone = create(api, runner, input="Hi", store=False)
    with pytest.raises(MstarError) as info:
        call(api.retrieve, runner, gone["id"])
    assert info.value.code == Code.NOT_FOUND
    assert call(api.delete, runner, kept["id"]) == {"id": kept["id"], "object": "response", "deleted": True}
    with pytest.raises(MstarError):
        call(api.delete, runner, kept["id"])


def test_previous_response_id_continues_the_conversation(api, runner):
    first = create(api, runner, input="Hi", instructions="Be brief.", max_output_tokens=3)
    reply = first["output"][0]["content"][0]["text"]
    second = create(api, runner, input="And?", previous_response_id=first["id"], max_output_tokens=500)
    # The conversation: first input, first output, new input; instructions are not carried over.
    expected = echo(runner, [("user", "Hi"), ("assistant", reply), ("user", "And?")], 500)
    assert second["output"][0]["content"][0]["text"] == expected
    assert second["previous_response_id"] == first["id"]
    with pytest.raises(MstarError) as info:
        create(api, runner, input="x", previous_response_id="resp_nope")
    assert info.value.code == Code.NOT_FOUND and info.value.metadata["field"] == "previous_response_id"


def test_store_survives_a_restart(tmp_path, runner):
    path = tmp_path / "r.sqlite3"
    store = asyncio.run(ResponseStore(path).open())
    first = create(ResponsesApi(store), runner, input="Hi")
    asyncio.run(store.close())
    store = asyncio.run(ResponseStore(path).open())
    again = create(ResponsesApi(store), runner, input="More", previous_response_id=first["id"])
    assert again["status"] in ("completed", "incomplete")
    asyncio.run(store.close())


@pytest.mark.parametrize(("fields", "field", "reason"), [
    ({"input": []}, "input", "INVALID_FIELD"),
    ({"input": 3}, "input", "INVALID_FIELD"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "INVALID_FIELD"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].call_id", "INVALID_FIELD"),
    ({"input": [{"type": "computer_call", "x": 1}]}, "input[0]", "UNSUPPORTED_FIELD"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
     "tool_choice.name", "INVALID_FIELD"),
    ({"text": {"format": {"type": "json_object"}}, "tools": [{"type": "function", "name": "f"}]}, "text.format",
     "INVALID_FIELD"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].image_url", "INVALID_IMAGE"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]},
     "input[0].content[0]", "UNSUPPORTED_FIELD"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "INVALID_FIELD"),
    ({"temperature": 9}, "temperature", "INVALID_FIELD"),
    ({"stop": ["x"]}, "stop", "UNKNOWN_FIELD"),
    ({"tools": [{"type": "function"}]}, "tools[0].name", "INVALID_FIELD"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "INVALID_FIELD"),
    ({"background": True}, "background", "UNSUPPORTED_FIELD"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "INVALID_FIELD"),
])
def test_bad_bodies_name_the_field_as_sent(api, runner, fields, field, reason):
    with pytest.raises(MstarError) as info:
        create(api, runner, **{"input": "Hi", **fields})
    err = info.value
    assert err.code == Code.INVALID_ARGUMENT and err.reason == reason
    assert err.field_violations[0].field.startswith(field)


def test_cancel_a_running_response_then_it_is_idempotent(api, model):
    runner = make_runner(model, EchoBackend(step_s=0.01, hold=True))

    async def go():
        scope = runner.scope()
        body = http({"input": "Hi", "max_output_tokens": 1000, "stream": True})
        stream = api.create(body, scope)
        first = await anext(stream)
        response_id = json.loads(first.data.split(b"data: ")[1])["response"]["id"]
        reader = asyncio.create_task(_drain(stream))
        await asyncio.sleep(0.05)
        cancelled = [f async for f in api.cancel(HttpRequest(params={"response_id": response_id}), scope)]
        rest = await reader
        again = [f async for f in api.cancel(HttpRequest(params={"response_id": response_id}), scope)]
        scope.close()
        return json.loads(cancelled[0].data), rest, json.loads(again[0].data)

    cancelled, rest, again = asyncio.run(go())
    assert cancelled["status"] == "cancelled" and again["status"] == "cancelled"
    assert b'"status":"cancelled"' in rest[-1].data and runner.num_running == 0


async def _drain(stream):
    return [f async for f in stream]


def test_keepalive_comments_while_queued(api, model):
    runner = make_runner(model, EchoBackend(step_s=0.05))
    runner.deps.keepalive_s = 0.01
    events = create(api, runner, input="Hi", stream=True, max_output_tokens=2)
    assert (":", ": keep-alive") in events and events[-1][0] == "response.incomplete"
