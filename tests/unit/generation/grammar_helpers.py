"""Structured-output test helpers: run constrained requests on the tiny model, read their text back."""

from __future__ import annotations

import json
import re

from generation_helpers import drive, make_engine

from services.common.structured_output import tool_call_tag
from services.generation.engine import Engine
from services.generation.sampling_params import SamplingParams

EOS = 2  # TINY's eos id; the synthetic vocabulary spells it "</s>" (a control token)
IDLE_WAIT_S = 0.05  # an iteration with nothing to step waits this long for a compiled grammar
CALL_BEGIN = '<tool_call>{"name": "%s", "arguments": '
CALL_END = "}</tool_call>"
CALL = re.compile(r'<tool_call>\{"name": "(\w+)", "arguments": (.*?)\}</tool_call>', re.S)


def text_of(engine: Engine, token_ids: list[int]) -> str:
    """What the tokens spell (control tokens, EOS included, spell nothing; unconstrained rows may also
    sample the unused ids past the vocabulary: "?")."""
    vocabulary = engine.runner.vocabulary
    spelled = (vocabulary.tokens[t] if t < len(vocabulary) else "?" for t in token_ids)
    return "".join(s for t, s in zip(token_ids, spelled, strict=True) if t not in vocabulary.control_token_ids)


def run(engine: Engine, requests: dict):
    """requests: key -> (prompt ids, SamplingParams). Returns (texts, finish reasons, tokens, failures)."""
    for key, (prompt, params) in requests.items():
        engine.add_request(key, prompt, params)
    tokens, completed, failed, _ = drive(engine, idle_wait_s=IDLE_WAIT_S)
    texts = {k: text_of(engine, ids) for k, ids in tokens.items()}
    return texts, {k: c.finish_reason.label for k, c in completed.items()}, tokens, failed


def constrained(structured_output, seed: int = 0, temperature: float = 1.0, max_tokens: int = 200, **kw):
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens,
                          structured_output=structured_output, **kw)


def tool_tags(schemas: dict) -> list:
    """One call format per tool: <tool_call>{"name": NAME, "arguments": ARGS}</tool_call>."""
    return [tool_call_tag(CALL_BEGIN % name, schema, CALL_END) for name, schema in schemas.items()]


def parse_calls(text: str) -> tuple[list[tuple[str, object]], str]:
    """(name, parsed arguments) of every call in text, and the text outside the calls."""
    calls = [(m.group(1), json.loads(m.group(2))) for m in CALL.finditer(text)]
    return calls, CALL.sub("", text)


__all__ = ["EOS", "constrained", "make_engine", "parse_calls", "run", "text_of", "tool_tags"]
