"""Structured output and tool calling through Envoy with the official `openai` client and the real
model: every constrained output validates, tool calls come back as OpenAI shapes (streamed and
not), a follow-up turn with the tool result is accepted, and bad input is a 400 naming the field
while a request beside it completes untouched."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.e2e

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                        "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city", "unit"], "additionalProperties": False},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}}, "required": ["zone"],
    "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=stack.http_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_json_schema_outputs_validate_across_seeds(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in range(3):
        reply = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Describe a person."}], max_tokens=80,
            temperature=1.0, seed=seed, response_format=fmt)
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)


class City(BaseModel):
    name: str
    population: int
    coastal: bool


def test_parse_with_a_pydantic_model(client):
    reply = client.chat.completions.parse(
        model="default", messages=[{"role": "user", "content": "Name a city."}], max_tokens=60,
        temperature=0, response_format=City)
    city = reply.choices[0].message.parsed
    assert isinstance(city, City)


def _args_valid(call, tool):
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == tool["function"]["name"]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_tool_calls_then_the_follow_up_turn(client, choice):
    args = {"model": "default", "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": choice,
            "parallel_tool_calls": False, "max_tokens": 60, "temperature": 0}
    reply = client.chat.completions.create(**args)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    tool = WEATHER if call.function.name == "get_weather" else TIME
    _args_valid(call, tool)
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    # Streamed: the fragments assemble into the same call (greedy: same name and arguments).
    names, arguments, ids, finish = {}, {}, {}, None
    for chunk in client.chat.completions.create(**args, stream=True):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for frag in c.delta.tool_calls or ():
                ids[frag.index] = frag.id or ids.get(frag.index)
                if frag.function.name:
                    names[frag.index] = frag.function.name
                arguments[frag.index] = arguments.get(frag.index, "") + (frag.function.arguments or "")
    assert finish == "tool_calls" and names == {0: call.function.name}
    assert arguments == {0: call.function.arguments} and ids[0].startswith("call_")
    # The follow-up turn carries the call and its result.
    follow = client.chat.completions.create(
        model="default", max_tokens=12, temperature=0, tools=[WEATHER, TIME],
        messages=[*ASK, message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}])
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_completions_guided_choice_and_response_format(client):
    reply = client.completions.create(model="default", prompt="The sky is", max_tokens=5, temperature=1.0,
                                      seed=1, extra_body={"guided_choice": ["blue", "green"]})
    assert reply.choices[0].text in ("blue", "green")
    reply = client.completions.create(model="default", prompt="A person:", max_tokens=80, temperature=0,
                                      extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(reply.choices[0].text), dict)


def _bad(client, field, **body):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="default", max_tokens=8, **body)
    assert info.value.status_code == 400 and info.value.param == field, info.value


def test_bad_input_is_a_400_naming_the_field_and_the_batch_is_unaffected(client):
    plain = {"model": "default", "messages": ASK, "max_tokens": 24, "temperature": 0}
    expected = client.chat.completions.create(**plain).choices[0].message.content
    with ThreadPoolExecutor(2) as pool:
        beside = pool.submit(client.chat.completions.create, **plain)
        _bad(client, "response_format.json_schema.schema", messages=ASK, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}})
        _bad(client, "tool_choice.function.name", messages=ASK, tools=[WEATHER],
             tool_choice={"type": "function", "function": {"name": "nope"}})
        _bad(client, "messages[1].tool_call_id",
             messages=[*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "21"}])
        _bad(client, "tools[0].function.parameters", messages=ASK, tool_choice="required", tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
                "a": {"type": "strin"}}}}}])
        assert beside.result().choices[0].message.content == expected


def test_anthropic_tool_use_and_tool_result(stack):
    import anthropic

    claude = anthropic.Anthropic(base_url=stack.http_url, api_key="unused", max_retries=0, timeout=120)
    tool = {"name": "get_weather", "description": "Current weather in a city.",
            "input_schema": WEATHER["function"]["parameters"]}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = claude.messages.create(model="default", max_tokens=60, extra_body={"temperature": 0}, messages=ask, tools=[tool],
                                   tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    assert reply.stop_reason == "tool_use"
    use = next(b for b in reply.content if b.type == "tool_use")
    jsonschema.validate(use.input, tool["input_schema"])
    with claude.messages.stream(model="default", max_tokens=60, extra_body={"temperature": 0}, messages=ask, tools=[tool],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [b.input for b in final.content if b.type == "tool_use"] == [use.input]
    follow = claude.messages.create(model="default", max_tokens=8, extra_body={"temperature": 0}, tools=[tool], messages=[
        *ask, {"role": "assistant", "content": reply.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"}]}])
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_responses_function_call_and_output(client):
    tool = {"type": "function", **WEATHER["function"]}
    first = client.responses.create(model="default", input="What is the weather in Paris?", tools=[tool],
                                    tool_choice="required", parallel_tool_calls=False, max_output_tokens=60,
                                    temperature=0)
    (call,) = [o for o in first.output if o.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), tool["parameters"])
    follow = client.responses.create(model="default", previous_response_id=first.id, max_output_tokens=8,
                                     temperature=0, input=[{"type": "function_call_output", "call_id": call.call_id,
                                                            "output": "21 C"}])
    assert follow.status in ("completed", "incomplete")
