"""Tool calls as text (services/preprocess/tools.py): the grammar a tool_choice becomes, parsing
the model's output whole or streamed in any cut, and the prompt for templates with and without
tool support."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.structured_output import validate_structured_output
from services.preprocess import tools
from services.preprocess.chat_template import ChatMessage, ChatTemplate
from services.preprocess.tokenizer import SpecialTokens

WEATHER = tools.Tool("get_weather", "Weather now.", {"type": "object", "properties": {"city": {"type": "string"}}})
TIME = tools.Tool("get_time")


def call_text(name: str, args: dict) -> str:
    return tools.begin(name) + json.dumps(args, separators=(", ", ": ")) + tools.END


def test_tool_choice_becomes_the_grammar_and_engine_errors_name_the_tool():
    auto = tools.constraint([WEATHER, TIME], tools.AUTO, parallel=True)
    assert not auto.tool_calls.require_call and len(auto.tool_calls.tags) == 2
    named = tools.constraint([WEATHER, TIME], "get_time", parallel=False)
    assert named.tool_calls.require_call and not named.tool_calls.parallel
    assert [t.begin for t in named.tool_calls.tags] == [tools.begin("get_time")]
    assert tools.constraint([WEATHER], tools.NONE, parallel=True) is None
    for c in (auto, named):
        validate_structured_output(c)
    renames = dict(tools.field_renames([WEATHER, TIME], "get_time"))
    assert renames["structured_output.tool_calls.tags[0].json_schema"] == "tools[1].function.parameters"


def test_parse_keeps_text_and_reads_calls():
    text = "Let me check." + call_text("get_weather", {"city": "Paris"}) + "\n" + call_text("get_time", {})
    parsed = tools.parse(text)
    assert parsed.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get_weather", {"city": "Paris"}),
                                                                         ("get_time", {})]
    assert all(c.id.startswith("call_") for c in parsed.calls) and parsed.calls[0].id != parsed.calls[1].id
    cut = tools.parse("ok " + call_text("get_weather", {"city": "Paris"})[:-5])  # max_tokens mid-call
    assert cut.calls == () and cut.content.startswith("ok <tool_call>")
    assert tools.parse("a < b <tool").content == "a < b <tool"


ARGS = st.dictionaries(st.text(min_size=1, max_size=6), st.one_of(st.integers(), st.text(max_size=8), st.booleans(),
                                                                    st.lists(st.integers(), max_size=3)), max_size=4)


@settings(max_examples=60, deadline=None)
@given(before=st.text(max_size=20).filter(lambda s: "<" not in s), args=st.lists(ARGS, min_size=0, max_size=3),
       cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_streamed_in_any_cut_equals_parsed_whole(before, args, cuts):
    text = before + "\n".join(call_text("f", a) for a in args)
    stream, content, calls = tools.CallStream(), "", []
    start = 0
    for cut in sorted({min(c, len(text)) for c in cuts} | {len(text)}):
        shown, done = stream.feed(text[start:cut])
        content, calls, start = content + shown, calls + done, cut
    content += stream.finish()
    whole = tools.parse(text)
    assert content == whole.content == before
    assert [json.loads(c.arguments) for c in calls] == [json.loads(c.arguments) for c in whole.calls] == args


def test_fallback_prompt_for_a_template_without_tools(model_spec):
    template = model_spec.chat_template
    assert not template.supports_tools
    call = tools.ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    messages = [ChatMessage("user", "Weather?"), ChatMessage("assistant", "", (call,)),
                ChatMessage("tool", "21 C", tool_call_id="call_1")]
    text = template.render(messages, tools=(WEATHER,))
    assert text.startswith("<|im_start|>system\n# Tools\n") and '"name": "get_weather"' in text
    assert "<|im_start|>assistant\n" + call.text() + "<|im_end|>" in text
    assert "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>" in text


TOOL_TEMPLATE = (
    "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %} CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}"
    "{% if m.tool_call_id %} FOR {{ m.tool_call_id }}{% endif %}\n{% endfor %}"
)


def test_a_template_with_tools_gets_them_as_hugging_face_passes_them():
    template = ChatTemplate(TOOL_TEMPLATE, SpecialTokens("<s>", "</s>", (2,), frozenset({1, 2})))
    assert template.supports_tools
    call = tools.ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    text = template.render([ChatMessage("assistant", "", (call,)), ChatMessage("tool", "21", tool_call_id="call_1")],
                           add_generation_prompt=False, tools=(WEATHER,))
    assert text.startswith('TOOLS [{"type": "function", "function": {"name": "get_weather"')
    assert text.endswith('assistant:  CALL get_weather {"city": "Paris"}tool: 21 FOR call_1')  # trim_blocks


@pytest.mark.parametrize("choice", [tools.AUTO, tools.REQUIRED, "get_weather"])
def test_every_tool_choice_is_a_valid_constraint(choice):
    validate_structured_output(tools.constraint([WEATHER, TIME], choice, parallel=True))
