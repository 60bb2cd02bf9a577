"""Whether a prompt fits the model's context: the one rule, and its PROMPT_TOO_LONG error.

A prompt fits when it leaves room for the tokens it must generate (one at least; none for an
embedding, which only prefills). Preprocess applies the rule wherever a prompt grows: before the
template or the tokenizer run, on a lower bound of the tokens a text can become; after each
appended chunk; when the input ends; on each embedding input. The generation engine applies it
again to the token ids it is sent, a defence for any GenerationService client. Plain Python (the
engine core imports it: tests/unit/generation/test_core_purity.py).
"""

from __future__ import annotations

from services.common.errors import MstarError, invalid_argument


def prompt_too_long(prompt_tokens: int, context_length: int, field: str, output_tokens: int = 1,
                    at_least: bool = False) -> MstarError | None:
    """The error when `prompt_tokens` and the `output_tokens` it must leave room for exceed
    `context_length`, else None. `at_least`: `prompt_tokens` is a lower bound (text not yet
    tokenized), and the message says so. `field` names the input as the client sent it."""
    if prompt_tokens + output_tokens <= context_length:
        return None
    room = f" (prompt + at least {output_tokens} generated token)" if output_tokens else ""
    err = invalid_argument(
        field, f"prompt is {'at least ' if at_least else ''}{prompt_tokens} tokens; the context holds "
               f"{context_length}{room}",
        reason="PROMPT_TOO_LONG",
    )
    err.metadata.update(prompt_tokens=str(prompt_tokens), context_length=str(context_length))
    return err


def check_prompt_fits(prompt_tokens: int, context_length: int, field: str, output_tokens: int = 1,
                      at_least: bool = False) -> None:
    """Raise `prompt_too_long`'s error, if there is one."""
    err = prompt_too_long(prompt_tokens, context_length, field, output_tokens, at_least)
    if err is not None:
        raise err
