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
