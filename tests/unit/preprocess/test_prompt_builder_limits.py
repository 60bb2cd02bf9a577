"""A prompt that cannot fit is refused before tokenizing it (tokenizing runs on the event loop)."""

import pytest

from services.common.errors import Code, MstarError
from services.preprocess.media import FileReader
from services.preprocess.model import load_model
from services.preprocess.prompt import PromptBuilder
from services.preprocess.request import RequestSpec, Sampling


@pytest.fixture(scope="module")
def model():
    return load_model("default")


def _spec(text: str) -> RequestSpec:
    return RequestSpec(request_id="r", client_request_id="", model="", text=text, messages=(), parts=(),
                       open_inputs=frozenset(), sampling=Sampling(), extra_keys=(), upload_bytes=len(text))


def test_hopelessly_long_text_is_refused_without_tokenizing(model):
    text = "x" * (model.tokenizer.max_token_bytes * model.context_length + 1)
    builder = PromptBuilder(model, FileReader(None, 1))
    with pytest.raises(MstarError) as info:
        builder.start(_spec(text * 4))
    assert info.value.code == Code.INVALID_ARGUMENT and info.value.reason == "PROMPT_TOO_LONG"
    assert builder.num_tokens == 0  # refused before tokenizing (the old path counted tokens first)


def test_a_text_that_may_fit_is_still_tokenized(model):
    builder = PromptBuilder(model, FileReader(None, 1))
    ids = builder.start(_spec("Hello there"))
    assert ids and builder.num_tokens == len(ids)


class _CountingTokenizer:
    """The real tokenizer, counting the characters the pre-tokenizer scans for commit points."""

    def __init__(self, real) -> None:
        self._real = real
        self.scanned = 0

    def stable_prefix_length(self, text: str) -> int:
        self.scanned += len(text)
        return self._real.stable_prefix_length(text)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _counting_builder(model):
    builder = PromptBuilder(model, FileReader(None, 1))
    counting = _CountingTokenizer(model.tokenizer)
    builder._tokenizer = counting
    return builder, counting


def _open_spec(parts=()) -> RequestSpec:
    return RequestSpec(request_id="r", client_request_id="", model="", text="", messages=(), parts=parts,
                       open_inputs=frozenset({"text"}), sampling=Sampling(), extra_keys=(), upload_bytes=0)


def test_one_character_parts_cost_linear_work(model):
    # Issue 13, finding 11: 10k one-character prompt parts (one unbroken word) re-scanned all the
    # held text per part: quadratic (~50M characters here), seconds on the event loop.
    from services.preprocess.request import TEXT, Part

    n = 10_000
    builder, counting = _counting_builder(model)
    builder.start(_open_spec(tuple(Part(TEXT, text="a") for _ in range(n))))
    assert counting.scanned <= 4 * n, counting.scanned


def test_one_character_appends_cost_linear_work_and_tokenize_like_one_text(model):
    from services.preprocess.request import TEXT, Part

    text = "word " * 200 + "x" * 3000 + " tail"
    builder, counting = _counting_builder(model)
    ids = builder.start(_open_spec())
    for ch in text:
        ids += builder.append((Part(TEXT, text=ch),), frozenset())
    ids += builder.append((), frozenset({"text"}))
    assert counting.scanned <= 8 * len(text), counting.scanned
    assert ids == model.tokenizer.encode(text)  # committing later never changes the tokens
