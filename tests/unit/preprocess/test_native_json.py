"""The native routes' JSON bodies (services/preprocess/native_json.py, json_array.py): proto3 JSON
read as protobuf's own parser reads it, except that an unknown field is an error naming it, and a
Session body split into its actions as the bytes arrive."""

import json
import random

import pytest
from google.protobuf import json_format
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import messages_pb2 as pb

from services.common.errors import MstarError
from services.preprocess.json_array import ArrayElements, TooLarge
from services.preprocess.native_json import body_message


def read(value, message=None, root="input"):
    data = value if isinstance(value, bytes) else json.dumps(value).encode()
    return body_message(data, message or pb.PreprocessInput(), root)


def refused(value, message=None, root="input") -> MstarError:
    with pytest.raises(MstarError) as info:
        read(value, message, root)
    return info.value


VALID = [
    {"text": "hi", "model_kwargs": {"sampling": {"max_tokens": 8, "temperature": 0, "stop": ["\n"]}}},
    {"requestId": "r-1", "modelKwargs": {"sampling": {"maxTokens": "3", "topP": 0.5, "seed": "-9007199254740993"}}},
    {"messages": [{"role": "user", "content": "hi"}], "output_modalities": ["MODALITY_TEXT", 2]},
    {"prompt_parts": [{"modality": "MODALITY_TOKENS", "token_ids": {"ids": [1, 2, 3]}},
                      {"data": "aGVsbG8=", "mime_type": "text/plain"}, {"data": "aGk"}]},
    {"model_kwargs": {"extra": {"a": [1, {"b": None}], "c": "x"}, "embedding": {"dimensions": 8}},
     "trace_context": {"traceparent": "00-abc"}},
    {"model_kwargs": {"sampling": {"structured_output": {"choice": {"choices": ["a", "b"]}}, "temperature": "NaN"}}},
    {"text": None, "model_kwargs": {"sampling": {"max_tokens": None, "ignore_eos": True}}, "ends": []},
    {"model_kwargs": {"sampling": {"max_tokens": 3.0, "frequency_penalty": "-1.5e0"}}},
    {"model_kwargs": {"sampling": {"speculative": False, "temperature": 0.7, "seed": 3}}},
]


@pytest.mark.parametrize("value", VALID)
def test_valid_bodies_read_as_protobufs_own_parser_reads_them(value):
    assert read(value) == json_format.ParseDict(value, pb.PreprocessInput())


def test_a_long_token_list_is_read_whole():
    ids = list(range(200_000))
    assert list(read({"prompt_parts": [{"token_ids": {"ids": ids}}]}).prompt_parts[0].token_ids.ids) == ids


@pytest.mark.parametrize(("value", "field"), [
    ({"max_token": 3}, "input.max_token"),
    ({"text": "hi", "model_kwargs": {"sampling": {"max_token": 3}}}, "input.model_kwargs.sampling.max_token"),
    ({"model_kwargs": {"sampling": {"structured_output": {"jsonschema": "{}"}}}},
     "input.model_kwargs.sampling.structured_output.jsonschema"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "text": "b"}]}, "input.messages[1].text"),
    ({"prompt_parts": [{"token_ids": {"ids": [1], "id": 2}}]}, "input.prompt_parts[0].token_ids.id"),
    ({"input": {"text": "the GenerateRequest wrapper is not part of the body"}}, "input.input"),
    ({"MaxTokens": 1}, "input.MaxTokens"),
])
def test_an_unknown_field_at_any_depth_is_named(value, field):
    err = refused(value)
    assert err.reason == "UNKNOWN_FIELD" and err.field_violations[0].field == field
    assert err.message == f"{field}: unknown field"


@pytest.mark.parametrize(("value", "field", "words"), [
    ({"text": 5}, "input.text", "string"),
    ({"model_kwargs": {"sampling": {"max_tokens": "many"}}}, "input.model_kwargs.sampling.max_tokens", "integer"),
    ({"model_kwargs": {"sampling": {"max_tokens": 1.5}}}, "input.model_kwargs.sampling.max_tokens", "integer"),
    ({"model_kwargs": {"sampling": {"max_tokens": True}}}, "input.model_kwargs.sampling.max_tokens", "integer"),
    ({"model_kwargs": {"sampling": {"max_tokens": 2**31}}}, "input.model_kwargs.sampling.max_tokens", "range"),
    ({"model_kwargs": {"sampling": {"temperature": "hot"}}}, "input.model_kwargs.sampling.temperature", "number"),
    ({"model_kwargs": {"sampling": {"ignore_eos": "yes"}}}, "input.model_kwargs.sampling.ignore_eos", "true or false"),
    ({"model_kwargs": {"sampling": {"speculative": 1}}}, "input.model_kwargs.sampling.speculative", "true or false"),
    ({"model_kwargs": {"sampling": {"stop": "x"}}}, "input.model_kwargs.sampling.stop", "array"),
    ({"model_kwargs": {"sampling": {"stop_token_ids": [1, 2**40]}}},
     "input.model_kwargs.sampling.stop_token_ids[1]", "range"),
    ({"model_kwargs": {"sampling": {"stop_token_ids": [1, "2", "x"]}}},
     "input.model_kwargs.sampling.stop_token_ids[2]", "integer"),
    ({"output_modalities": ["MODALITY_SMELL"]}, "input.output_modalities[0]", "not a Modality"),
    ({"prompt_parts": [{"data": "!!"}]}, "input.prompt_parts[0].data", "base64"),
    ({"prompt_parts": [{"text": "a", "file_path": "b"}]}, "input.prompt_parts[0].file_path", "conflicts"),
    ({"model_kwargs": "x"}, "input.model_kwargs", "object"),
    ({"model_kwargs": {"extra": [1]}}, "input.model_kwargs.extra", "Struct"),
    ({"trace_context": {"a": 1}}, "input.trace_context['a']", "string"),
    ([1, 2], "input", "object"),
])
def test_a_wrong_value_names_its_field(value, field, words):
    err = refused(value)
    assert err.reason == "INVALID_FIELD" and err.field_violations[0].field == field, err.message
    assert words in err.message, err.message


def test_bodies_that_are_not_json():
    assert read(b"") == pb.PreprocessInput() and read(b"  \n") == pb.PreprocessInput()  # as the transcoder read it
    for body in (b"{bad", b'{"text": "a\\udc00"}', b'{"t": NaN}'):
        assert refused(body).reason == "INVALID_JSON"


def test_session_actions_and_their_roots():
    start = read({"start": {"text": "hi"}}, api.SessionRequest(), "")
    assert start.start.text == "hi"
    assert refused({"start": {"txt": "hi"}}, api.SessionRequest(), "").field_violations[0].field == "start.txt"
    both = refused({"start": {}, "cancel": {"request_id": "a"}}, api.SessionRequest(), "")
    assert both.field_violations[0].field == "cancel" and "conflicts with start" in both.message
    append = read({"text": " more", "ends": ["MODALITY_TEXT"]}, pb.ClientAppend(), "append")
    assert append.ends == [pb.MODALITY_TEXT]
    assert refused({"txt": "x"}, pb.ClientAppend(), "append").field_violations[0].field == "append.txt"


# ---- a Session body arriving in pieces


def split(data: bytes, cuts: list[int], cap: int = 1 << 30) -> list[bytes]:
    elements, out, at = ArrayElements(cap), [], 0
    for cut in sorted(cuts):
        out += elements.feed(data[at:cut])
        at = cut
    out += elements.feed(data[at:])
    elements.end()
    return out


ARRAYS = [
    [],
    [{"start": {"text": "a,]}[\"\\", "model_kwargs": {"sampling": {"stop": ["]", "}"]}}}}],
    [{"x": [1, [2, {"y": "]"}]]}, 3, "s\"t,]", [], {}, None, True, -1.5e3],
    [{"start": {"prompt_parts": [{"token_ids": {"ids": list(range(500))}}]}}] * 3,
]


@pytest.mark.parametrize("array", ARRAYS)
def test_elements_come_out_whole_wherever_the_upload_is_cut(array):
    data = json.dumps(array).encode()
    rng = random.Random(len(data))
    for _ in range(100):
        cuts = rng.sample(range(len(data) + 1), rng.randint(0, min(40, len(data))))
        assert [json.loads(e) for e in split(data, cuts)] == array
    assert [json.loads(e) for e in split(data, list(range(len(data))))] == array  # one byte at a time


def test_each_element_is_returned_as_soon_as_it_is_complete():
    elements = ArrayElements(1 << 20)
    assert elements.feed(b'[{"start": {"text": "a"}}') == [b'{"start": {"text": "a"}}']
    assert elements.feed(b', {"append": {"te') == []
    assert elements.feed(b'xt": "b"}} ') == [b'{"append": {"text": "b"}}']
    assert elements.feed(b"]\n") == []
    elements.end()


@pytest.mark.parametrize(("data", "words"), [
    (b'{"start": {}}', "must be a JSON array"),
    (b"[1 2]", "expected , or ]"),
    (b"[1,]", "expected an array element"),
    (b"[,1]", "expected an array element"),
    (b'[{"a": 1}', "ends inside its array"),
    (b"[1] x", "after the end"),
])
def test_an_upload_that_is_not_one_array_is_an_error(data, words):
    with pytest.raises(ValueError, match=words):
        split(data, list(range(0, len(data), 3)))


def test_an_element_cannot_grow_past_the_cap():
    elements = ArrayElements(100)
    elements.feed(b'[{"start": {"text": "' + b"x" * 50)
    with pytest.raises(TooLarge):
        elements.feed(b"x" * 60)
