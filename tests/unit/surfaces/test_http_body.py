"""Request bodies as declared models: malformed JSON, strict types, unknown / ignored / unsupported
fields, error paths as the client spelled them (OpenAI bodies; the other surfaces share Body)."""

from __future__ import annotations

import json

import pytest

from services.common.errors import MstarError
from services.preprocess.surfaces.fields import sampling_of
from services.preprocess.surfaces.http import HttpRequest, parse
from services.preprocess.surfaces.openai.body import ChatBody, CompletionBody
from services.preprocess.surfaces.sampling_names import CHAT, COMPLETIONS

MSG = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatBody:
    return parse(ChatBody, HttpRequest(json.dumps({"model": "m", "messages": MSG, **fields}).encode(), "application/json"))


def completion(**fields) -> CompletionBody:
    body = json.dumps({"model": "m", "prompt": "hi", **fields}).encode()
    return parse(CompletionBody, HttpRequest(body, "application/json"))


def field_of(fn, **fields) -> str:
    with pytest.raises(MstarError) as info:
        fn(**fields)
    assert info.value.http_status == 400
    return info.value.field_violations[0].field


@pytest.mark.parametrize(("body", "ctype"), [
    (b"", "application/json"), (b"{bad", "application/json"), (b"[1]", "application/json"),
    (b'"s"', "application/json"), (b'{"a": "\xff"}', "application/json"), (b'{"a": "\\ud800"}', ""),
    (b'{"model": "m"}', "application/x-www-form-urlencoded"),
])
def test_malformed_bodies_name_the_body(body, ctype):
    with pytest.raises(MstarError) as info:
        parse(ChatBody, HttpRequest(body, ctype))
    assert info.value.http_status == 400 and info.value.field_violations[0].field == "body"


def test_nan_and_infinity_are_not_json_even_in_ignored_fields():
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        for key in (b"temperature", b"metadata"):
            body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "' + key + b'": ' + literal + b"}"
            with pytest.raises(MstarError) as info:
                parse(ChatBody, HttpRequest(body, "application/json"))
            assert info.value.field_violations[0].field == "body" and info.value.reason == "INVALID_JSON"
    overflow = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 1e999}'
    with pytest.raises(MstarError) as info:  # a number that overflows to inf is not finite
        parse(ChatBody, HttpRequest(overflow, "application/json"))
    assert info.value.field_violations[0].field == "temperature"


def test_sampling_from_the_table():
    s = sampling_of(chat(temperature=0.5, stop="x", max_tokens=4, top_k=-1, seed=41), CHAT)
    assert (s.temperature, s.stop, s.max_tokens, s.top_k, s.seed, s.top_p) == (0.5, ("x",), 4, 0, 41, None)
    assert sampling_of(chat(stop=["a", "", "b"]), CHAT).stop == ("a", "b")
    assert sampling_of(chat(max_completion_tokens=9, max_tokens=9), CHAT).max_tokens == 9
    assert sampling_of(completion(logprobs=2), COMPLETIONS).logprobs == 2
    assert chat(logprobs=True).logprobs_n == 0 and chat(logprobs=True, top_logprobs=3).logprobs_n == 3
    assert chat().logprobs_n is None


@pytest.mark.parametrize(("name", "value", "path"), [
    ("temperature", 2.5, "temperature"), ("temperature", True, "temperature"), ("top_p", 0, "top_p"),
    ("n", 0, "n"), ("n", 1000, "n"), ("seed", 1.0, "seed"), ("presence_penalty", 3, "presence_penalty"),
    ("top_k", -2, "top_k"), ("min_p", 2, "min_p"), ("repetition_penalty", 0, "repetition_penalty"),
    ("top_logprobs", 50, "top_logprobs"), ("max_tokens", 0, "max_tokens"), ("max_tokens", 2**31, "max_tokens"),
    ("stop", ["x"] * 17, "stop"), ("stop", ["x" * 2000], "stop[0]"), ("stop_token_ids", [1, -1], "stop_token_ids[1]"),
    ("stream_options", {"include_usage": "y"}, "stream_options.include_usage"),
    ("stream_options", {"bogus": 1}, "stream_options.bogus"), ("model", "m" * 300, "model"),
    ("messages", [{"role": "user", "content": "x"}] * 1025, "messages"),
])
def test_bounds_and_types_name_the_field(name, value, path):
    assert field_of(chat, **{name: value}) == path


def test_prompt_forms():
    assert completion(prompt=["one"]).prompt == "one"
    assert completion(prompt=[1, 2, 3]).prompt == [1, 2, 3]
    assert completion(prompt=[[4, 5]]).prompt == [4, 5]
    assert field_of(completion, prompt=["a", "b"]) == "prompt"
    assert field_of(completion, prompt=[1, "a"]) == "prompt[1]"
    assert field_of(completion, prompt=5) == "prompt"
    assert field_of(completion, prompt=[1, -5]) == "prompt[1]"
    assert field_of(completion, prompt=None) == "prompt"


def test_ignored_fields_pass_and_unknown_keys_are_not_echoed_unbounded():
    chat(user="u", metadata={"a": 1}, store=True, service_tier="auto", parallel_tool_calls=False,
         prompt_cache_key="k", safety_identifier="s")
    with pytest.raises(MstarError) as info:
        chat(**{"k" * 100_000: 1})
    assert info.value.reason == "UNKNOWN_FIELD" and len(info.value.message) < 300
