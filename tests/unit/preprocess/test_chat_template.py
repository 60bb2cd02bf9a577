"""The default model's chat template renders exactly like transformers' apply_chat_template."""

from __future__ import annotations

import pytest

from services.preprocess.chat_template import ChatMessage, ChatTemplate, ChatTemplateError
from services.preprocess.tokenizer import SpecialTokens

CONVERSATIONS = [
    [("user", "What is the capital of France?")],
    [("system", "You are terse."), ("user", "hi")],
    [("user", "hi"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke 😀")],
    [("system", ""), ("user", "  spaces  \n\n and newlines\n")],
    [("user", "中文 {{ not a template }} {% raw %}")],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_equals_transformers(model_spec, hf_tokenizer, conversation, add_generation_prompt):
    messages = [ChatMessage(r, c) for r, c in conversation]
    ours = model_spec.chat_template.render(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf_tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in conversation],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    assert ours == theirs
    assert model_spec.tokenizer.encode(ours) == hf_tokenizer.encode(theirs, add_special_tokens=False)


def test_default_system_prompt(model_spec):
    text = model_spec.chat_template.render([ChatMessage("user", "hi")])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_render_open_splits_around_streamed_content(model_spec):
    messages = [ChatMessage("user", "Summarise: ")]
    head, tail = model_spec.chat_template.render_open(messages)
    whole = model_spec.chat_template.render([ChatMessage("user", "Summarise: more text")])
    assert head + "more text" + tail == whole
    assert tail == "<|im_end|>\n<|im_start|>assistant\n"


def test_unknown_role_rejected(model_spec):
    with pytest.raises(ChatTemplateError, match="role"):
        model_spec.chat_template.render([ChatMessage("critic", "x")])


SPECIAL = SpecialTokens("<s>", "</s>", (2,), frozenset({1, 2}))


def test_raise_exception_becomes_error():
    template = ChatTemplate("{{ raise_exception('no system role') }}", SPECIAL)
    with pytest.raises(ChatTemplateError, match="no system role"):
        template.render([ChatMessage("user", "x")])


def test_sandbox_blocks_python_internals():
    template = ChatTemplate("{{ messages.__class__.__mro__ }}", SPECIAL)
    with pytest.raises(ChatTemplateError):
        template.render([ChatMessage("user", "x")])


def test_tojson_does_not_html_escape_and_tokens_are_variables():
    template = ChatTemplate("{{ bos_token }}{{ messages[0].content | tojson }}{{ eos_token }}", SPECIAL)
    assert template.render([ChatMessage("user", "<a & b>")]) == '<s>"<a & b>"</s>'


def test_trim_and_lstrip_blocks():
    source = "{% for m in messages %}\n  {% if true %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}"
    template = ChatTemplate(source, SPECIAL)
    assert template.render([ChatMessage("user", "a"), ChatMessage("user", "b")]) == "[a]\n[b]\n"
