"""A tokenizer that asks for BOS gets it before a text prompt (as llama.cpp's server and vLLM's
completions do), not before a chat (the template writes it) nor before client token ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.errors import MstarError
from services.preprocess.chat_template import ChatMessage, ChatTemplate
from services.preprocess.media import FileReader
from services.preprocess.model import ModelSpec
from services.preprocess.prompt import PromptBuilder
from services.preprocess.request import TEXT, TOKENS, Part, RequestSpec
from services.preprocess.tokenizer import Tokenizer

CONTROLS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "\n", "he", "ll", "llo", "hello", "▁w", "or", "world", "▁world"]
BOS = CONTROLS.index("<bos>")
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n"
            "{% endfor %}<start_of_turn>model\n")


def gemma_like(add_bos: bool) -> Tokenizer:
    tokens = CONTROLS + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    return Tokenizer.from_gguf_fields({
        "general.architecture": "gemma3",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [-1000.0] * len(CONTROLS) + [0.0] * 256 + [-float(i) for i in range(len(PIECES))],
        "tokenizer.ggml.token_type": [3] * len(CONTROLS) + [6] * 256 + [1] * len(PIECES),
        "tokenizer.ggml.bos_token_id": BOS,
        "tokenizer.ggml.eos_token_id": CONTROLS.index("<eos>"),
        "tokenizer.ggml.unknown_token_id": CONTROLS.index("<unk>"),
        "tokenizer.ggml.add_bos_token": add_bos,
        "tokenizer.ggml.add_space_prefix": False,
    })


def model(add_bos: bool = True, context_length: int = 4096) -> ModelSpec:
    tok = gemma_like(add_bos)
    return ModelSpec(name="tiny", path=Path("tiny.gguf"), context_length=context_length, tokenizer=tok,
                     chat_template=ChatTemplate(TEMPLATE, tok.special))


def start(spec_model: ModelSpec, **fields) -> tuple[PromptBuilder, list[int]]:
    builder = PromptBuilder(spec_model, FileReader(None, 1))
    return builder, builder.start(RequestSpec(**fields))


def test_a_text_prompt_gets_one_bos_first():
    m = model()
    builder, ids = start(m, text="hello world")
    assert ids == [BOS] + m.tokenizer.encode("hello world")
    assert builder.num_tokens == len(ids)
    assert builder.input_infos[0].num_tokens >= 1  # BOS is the first text part's


def test_prompt_parts_get_one_bos_before_the_first_text():
    m = model()
    _, ids = start(m, parts=(Part(TEXT, text="hello"), Part(TEXT, text=" world")))
    assert ids == [BOS] + m.tokenizer.encode("hello world") and ids.count(BOS) == 1


def test_streamed_text_gets_one_bos_and_tokenizes_like_one_text():
    m = model()
    builder, ids = start(m, open_inputs=frozenset({TEXT}))
    for chunk in ["hel", "lo w", "orld"]:
        ids += builder.append((Part(TEXT, text=chunk),), frozenset())
    ids += builder.append((), frozenset({TEXT}))
    assert ids == [BOS] + m.tokenizer.encode("hello world") and builder.num_tokens == len(ids)


def test_a_prompt_starting_with_token_ids_gets_no_bos():
    m = model()
    _, ids = start(m, parts=(Part(TOKENS, token_ids=(7, 8)), Part(TEXT, text="hello")))
    assert ids == [7, 8] + m.tokenizer.encode("hello")


def test_a_chat_gets_only_the_templates_bos():
    m = model()
    _, ids = start(m, messages=(ChatMessage("user", "hello"),))
    assert ids[0] == BOS and ids.count(BOS) == 1
    assert ids == m.tokenizer.encode(m.chat_template.render([ChatMessage("user", "hello")]))


def test_no_bos_when_the_tokenizer_says_no():
    m = model(add_bos=False)
    _, ids = start(m, text="hello world")
    assert ids == m.tokenizer.encode("hello world")


def test_bos_counts_in_the_fit_check():
    context = 8
    text = "o" * (gemma_like(True).max_token_bytes * (context - 2))  # at least context - 2 tokens
    start(model(add_bos=False, context_length=context - 1), text=text)  # prompt + 1 output fits
    with pytest.raises(MstarError) as info:
        start(model(add_bos=True, context_length=context - 1), text=text)  # BOS: one too many
    assert info.value.reason == "PROMPT_TOO_LONG"


def test_the_default_model_is_unchanged(model_spec):
    assert not model_spec.tokenizer.add_bos
    _, ids = start(model_spec, text="Hello world")
    assert ids == model_spec.tokenizer.encode("Hello world")
    messages = (ChatMessage("user", "Hi"),)
    _, ids = start(model_spec, messages=messages)
    assert ids == model_spec.tokenizer.encode(model_spec.chat_template.render(list(messages)))


@pytest.mark.parametrize("flag", [None, True, False])
@pytest.mark.parametrize("template", [True, False])
def test_an_hf_directory_adds_bos_when_transformers_does(tmp_path, flag, template):
    """Llama 3's tokenizer.json adds BOS in its post-processor's template and its tokenizer_config
    says nothing about it. transformers 5 (what vLLM encodes with) follows the template alone: BOS
    with it, none without, whatever add_bos_token says."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from tokenizers import models, pre_tokenizers, processors

    vocab = {"<|begin_of_text|>": 0, "<|end_of_text|>": 1, **{c: i + 2 for i, c in enumerate("helowrd Ġ")}}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in ("<|begin_of_text|>", "<|end_of_text|>")])
    if template:
        backend.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])])
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
              "tokenizer_class": "PreTrainedTokenizerFast",
              **({} if flag is None else {"add_bos_token": flag})}
    (tmp_path / "tokenizer_config.json").write_text(__import__("json").dumps(config))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path)).encode("hello")
    ours = Tokenizer.from_json(tmp_path / "tokenizer.json", config)
    assert ours.add_bos == (theirs[0] == 0)
    assert ([0] if ours.add_bos else []) + ours.encode("hello") == theirs
