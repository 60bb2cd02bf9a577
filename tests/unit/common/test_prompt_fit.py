"""One "prompt fits" rule: services/common/prompt_fit.py decides it and words its error, and every
site that refuses a prompt too long for the context goes through it."""

from __future__ import annotations

import pathlib

import pytest

from services.common.errors import Code, MstarError
from services.common.prompt_fit import check_prompt_fits, prompt_too_long

ROOT = pathlib.Path(__file__).resolve().parents[3]
# The generation servicer's frame cost check counts the ids of one frame before any per-token
# work, for a frame-size answer of its own; the engine then applies the rule (request_checks).
OWN_REASON = {"services/common/prompt_fit.py", "services/generation/servicer.py"}


def test_a_prompt_must_leave_room_for_one_generated_token_an_embedding_for_none():
    check_prompt_fits(8191, 8192, "input.text")
    check_prompt_fits(8192, 8192, "input", output_tokens=0)
    for n in (8192, 9000):
        with pytest.raises(MstarError) as info:
            check_prompt_fits(n, 8192, "input.text")
        err = info.value
        assert err.code == Code.INVALID_ARGUMENT and err.reason == "PROMPT_TOO_LONG"
        assert err.field_violations[0].field == "input.text" and err.message == (
            f"input.text: prompt is {n} tokens; the context holds 8192 (prompt + at least 1 generated token)")
        assert err.metadata == {"field": "input.text", "prompt_tokens": str(n), "context_length": "8192"}
    assert prompt_too_long(8193, 8192, "input", output_tokens=0, at_least=True).message == (
        "input: prompt is at least 8193 tokens; the context holds 8192")


def test_every_prompt_too_long_error_comes_from_the_one_helper():
    makers = {str(path.relative_to(ROOT)) for path in (ROOT / "services").rglob("*.py")
              if '"PROMPT_TOO_LONG"' in path.read_text(encoding="utf-8")}
    assert makers <= OWN_REASON
