"""OpenAI request parsing/validation: every bad input is a 400 that names the field."""

import json

import pytest

from services.common.errors import Code, MstarError
from services.preprocess.openai.convert import preprocess_input
from services.preprocess.openai.request import CHAT, COMPLETION, IGNORED, UNSUPPORTED, parse

MSG = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return parse(CHAT, json.dumps({"model": "m", "messages": MSG, **fields}).encode(), "application/json")


def completion(**fields):
    return parse(COMPLETION, json.dumps({"model": "m", "prompt": "hi", **fields}).encode(), "application/json")


def rejected(fn, **fields) -> MstarError:
    with pytest.raises(MstarError) as info:
        fn(**fields)
    assert info.value.code == Code.INVALID_ARGUMENT and info.value.http_status == 400
    return info.value


def field_of(err: MstarError) -> str:
    return err.field_violations[0].field


def test_stop_string_or_list():
    assert chat(stop="END").sampling.stop == ("END",)
    assert chat(stop=["a", "b", ""]).sampling.stop == ("a", "b")
    assert chat(stop=None).sampling.stop == ()
    assert field_of(rejected(chat, stop=5)) == "stop"
    assert field_of(rejected(chat, stop=["ok", 3])) == "stop[1]"
    assert field_of(rejected(chat, stop=["x"] * 17)) == "stop"
    assert field_of(rejected(chat, stop=["x" * 2000])) == "stop[0]"


def test_max_tokens_and_max_completion_tokens():
    assert chat(max_tokens=7).sampling.max_tokens == 7
    assert chat(max_completion_tokens=9).sampling.max_tokens == 9
    assert chat(max_tokens=9, max_completion_tokens=9).sampling.max_tokens == 9
    assert chat().sampling.max_tokens is None
    assert field_of(rejected(chat, max_tokens=5, max_completion_tokens=6)) == "max_tokens"
    assert completion().sampling.max_tokens == 16  # OpenAI's legacy default
    assert completion(max_tokens=3).sampling.max_tokens == 3


@pytest.mark.parametrize("value", [0, -1, 1.5, "256", True, 1e9, 2**31])
def test_bad_max_tokens_names_the_field(value):
    err = rejected(chat, max_tokens=value)
    assert field_of(err) == "max_tokens" and "max_tokens" in err.message


@pytest.mark.parametrize(("name", "value"), [
    ("temperature", -0.1), ("temperature", 2.5), ("temperature", "1"), ("top_p", 0), ("top_p", 1.5),
    ("n", 0), ("n", 1000), ("seed", 1.0), ("presence_penalty", 3), ("frequency_penalty", -3),
    ("stream", "yes"), ("top_k", -2), ("min_p", 2), ("repetition_penalty", 0), ("logprobs", 1),
    ("top_logprobs", 50), ("model", 3), ("stop_token_ids", [1, -1]),
])
def test_bad_types_and_ranges(name, value):
    field = field_of(rejected(chat, **{name: value}))
    assert field.split("[")[0] == name


def test_nan_and_infinity_literals_are_not_json():
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        body = b'{"model": "m", "messages": [], "temperature": ' + literal + b"}"
        with pytest.raises(MstarError) as info:
            parse(CHAT, body, "application/json")
        assert field_of(info.value) == "body"


@pytest.mark.parametrize(("body", "ctype"), [
    (b"", "application/json"), (b"{bad", "application/json"), (b"[1]", "application/json"),
    (b'"s"', "application/json"), (b'{"a": "\xff"}', "application/json"),
    (b'{"model": "m"}', "application/x-www-form-urlencoded"),
])
def test_malformed_bodies(body, ctype):
    with pytest.raises(MstarError) as info:
        parse(CHAT, body, ctype)
    assert info.value.http_status == 400 and field_of(info.value) == "body"


def test_unknown_field_rejected_ignored_field_accepted():
    err = rejected(chat, max_token=3)
    assert field_of(err) == "max_token" and err.reason == "UNKNOWN_FIELD"
    for name in IGNORED:
        chat(**{name: "x"})


def test_unsupported_fields_rejected_unless_neutral():
    err = rejected(chat, tools=[{"type": "function", "function": {"name": "f"}}])
    assert err.reason == "UNSUPPORTED_FIELD" and field_of(err) == "tools"
    chat(tools=[], tool_choice="none", response_format={"type": "text"}, logit_bias={})
    assert field_of(rejected(chat, response_format={"type": "json_object"})) == "response_format"
    assert field_of(rejected(completion, echo=True)) == "echo"
    assert field_of(rejected(completion, best_of=3)) == "best_of"
    completion(best_of=2, n=2)
    assert UNSUPPORTED[CHAT] and UNSUPPORTED[COMPLETION]


def test_messages():
    req = chat(messages=[{"role": "developer", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                         {"role": "assistant", "content": None, "name": "bot"}])
    assert req.messages == [("system", "be brief"), ("user", "ab"), ("assistant", "")]
    assert field_of(rejected(chat, messages=[])) == "messages"
    assert field_of(rejected(chat, messages=[{"role": "tool", "content": "x"}])) == "messages[0].role"
    assert field_of(rejected(chat, messages=[{"role": "user", "content": 5}])) == "messages[0].content"
    image = [{"type": "image_url", "image_url": {"url": "http://x"}}]
    assert field_of(rejected(chat, messages=[{"role": "user", "content": image}])) == "messages[0].content[0]"
    assert field_of(rejected(chat, messages=[{"role": "user", "content": "x", "tool_calls": [1]}])) \
        == "messages[0].tool_calls"
    with pytest.raises(MstarError) as info:
        parse(CHAT, b'{"model": "m"}', "application/json")
    assert field_of(info.value) == "messages"


def test_prompt_forms():
    assert completion(prompt=["one"]).prompt_text == "one"
    assert completion(prompt=[1, 2, 3]).prompt_token_ids == [1, 2, 3]
    assert completion(prompt=[[4, 5]]).prompt_token_ids == [4, 5]
    assert field_of(rejected(completion, prompt=["a", "b"])) == "prompt"
    assert field_of(rejected(completion, prompt=[1, "a"])) == "prompt"
    assert field_of(rejected(completion, prompt=None)) == "prompt"


def test_logprobs_and_stream_options():
    assert chat(logprobs=True).sampling.logprobs == 0
    assert chat(logprobs=True, top_logprobs=3).sampling.logprobs == 3
    assert chat().sampling.logprobs is None
    assert field_of(rejected(chat, top_logprobs=2)) == "top_logprobs"
    assert completion(logprobs=2).sampling.logprobs == 2
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage
    assert field_of(rejected(chat, stream_options={"include_usage": "y"})) == "stream_options.include_usage"
    assert field_of(rejected(chat, stream_options={"bogus": 1})) == "stream_options.bogus"


def test_preprocess_input_per_choice_seeds():
    req = chat(n=3, seed=41, temperature=0.5, stop="x", max_tokens=4, top_k=-1)
    inputs = [preprocess_input(req, i) for i in range(req.n)]
    assert [i.model_kwargs.sampling.seed for i in inputs] == [41, 42, 43]
    s = inputs[0].model_kwargs.sampling
    assert (s.temperature, list(s.stop), s.max_tokens, s.top_k) == (0.5, ["x"], 4, 0)
    assert not s.HasField("top_p")
    assert inputs[0].messages[0].content == "hi" and inputs[0].model == "m"
    unseeded = chat(n=2)
    assert not preprocess_input(unseeded, 1).model_kwargs.sampling.HasField("seed")
    tokens = preprocess_input(completion(prompt=[7, 8]), 0)
    assert list(tokens.prompt_parts[0].token_ids.ids) == [7, 8] and tokens.text == ""
