"""What a 200 must look like on each surface, streamed or not (docs/http.md), read from the body
the client sent: n choices, logprobs exactly when asked (top-k lists no longer than asked), no
stop string in the text, token counts within the budget, the stream's terminal event and no
error frame in it, a stored response retrievable exactly when `store` is not false."""

from __future__ import annotations

import base64
from typing import Any

from tests.matrix.exchange import Case, Outcome

HIDDEN = 576  # SmolLM2-135M's hidden size: an embedding's length without `dimensions`
CHAT_FINISH = {"stop", "length", "tool_calls"}
ANTHROPIC_STOPS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}
ANTHROPIC_EVENTS = {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
                    "message_delta", "message_stop", "ping"}


def ok_reply(case: Case, outcome: Outcome) -> list[str]:
    try:
        if case.streamed:
            if not outcome.is_sse:
                return [f"stream: true answered as {outcome.content_type!r}"]
            return _STREAMS[case.surface](case.body, outcome)
        if outcome.is_sse:
            return ["a non-streamed request answered as SSE"]
        return _REPLIES[case.surface](case.body, outcome.json(), outcome)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        return [f"malformed 200 ({type(exc).__name__}: {exc})"]


def _budget(body: dict[str, Any], surface: str) -> int:
    names = {"chat.completions": ("max_completion_tokens", "max_tokens"), "completions": ("max_tokens",),
             "messages": ("max_tokens",), "responses": ("max_output_tokens",)}[surface]
    given = [body[name] for name in names if body.get(name) is not None]
    return given[0] if given else 16  # only completions leaves it open in the matrix (OpenAI's 16)


def _stops(body: dict[str, Any], name: str = "stop") -> list[str]:
    stop = body.get(name)
    if body.get("include_stop_str_in_output"):
        return []
    return [s for s in ([stop] if isinstance(stop, str) else stop or []) if s]


def _check_text(text: str, stops: list[str], where: str) -> list[str]:
    return [f"{where} contains the stop string {s!r}" for s in stops if s in text]


def _logprob_k(body: dict[str, Any], surface: str) -> int | None:
    if surface == "chat.completions":
        return (body.get("top_logprobs") or 0) if body.get("logprobs") else None
    return body.get("logprobs")


def _check_usage(usage: dict[str, Any], budget: int, prompt: str = "prompt_tokens",
                 completion: str = "completion_tokens") -> list[str]:
    problems = []
    if not isinstance(usage.get(prompt), int) or usage[prompt] < 1:
        problems.append(f"usage.{prompt} {usage.get(prompt)!r}")
    if not isinstance(usage.get(completion), int) or not 0 <= usage[completion] <= budget:
        problems.append(f"usage.{completion} {usage.get(completion)!r} outside [0, {budget}]")
    return problems


# ---- OpenAI chat and completions

def _chat(body: dict, reply: dict, outcome: Outcome) -> list[str]:
    return _openai(body, reply, "chat.completions")


def _completions(body: dict, reply: dict, outcome: Outcome) -> list[str]:
    return _openai(body, reply, "completions")


def _openai(body: dict, reply: dict, surface: str) -> list[str]:
    chat = surface == "chat.completions"
    n = body.get("n") or 1
    problems = []
    if reply.get("object") != ("chat.completion" if chat else "text_completion"):
        problems.append(f"object {reply.get('object')!r}")
    if sorted(c["index"] for c in reply["choices"]) != list(range(n)):
        problems.append(f"{len(reply['choices'])} choices for n={n}")
    k = _logprob_k(body, surface)
    for c in reply["choices"]:
        text = (c["message"]["content"] or "") if chat else c["text"]
        problems += _check_text(text, _stops(body), f"choices[{c['index']}]")
        if c["finish_reason"] not in (CHAT_FINISH if chat else CHAT_FINISH - {"tool_calls"}):
            problems.append(f"finish_reason {c['finish_reason']!r}")
        problems += _check_logprobs(c.get("logprobs"), k, chat, f"choices[{c['index']}].logprobs")
    return problems + _check_usage(reply["usage"], n * _budget(body, surface))


def _check_logprobs(lp: Any, k: int | None, chat: bool, where: str) -> list[str]:
    if k is None:
        return [] if lp is None else [f"{where} present but not asked for"]
    if not isinstance(lp, dict):
        return [f"{where} missing (asked for {k})"]
    if chat:
        entries = lp.get("content")
        if not isinstance(entries, list):
            return [f"{where}.content {entries!r}"]
        return [f"{where}.content[{i}] has {len(e['top_logprobs'])} top_logprobs, asked {k}"
                for i, e in enumerate(entries) if len(e["top_logprobs"]) > k or e["logprob"] > 0]
    tokens, values, tops = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]
    if not len(tokens) == len(values) == len(tops) == len(lp["text_offset"]):
        return [f"{where} lists of unequal length"]
    # vLLM's completions list the chosen token among the alternatives: up to k + 1 entries.
    return [f"{where}.top_logprobs[{i}] has {len(t or {})} entries, asked {k}"
            for i, t in enumerate(tops) if len(t or {}) > k + 1]


def _openai_stream(body: dict, outcome: Outcome, surface: str) -> list[str]:
    chat = surface == "chat.completions"
    events = [e for e in outcome.events if e.data]
    if not events or events[-1].data != "[DONE]":
        return ["stream does not end with data: [DONE]"]
    chunks = [e.json() for e in events[:-1]]
    problems = [f"error frame: {c['error']}" for c in chunks if "error" in c]
    if problems:
        return problems
    n = body.get("n") or 1
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    finishes: dict[int, list[str]] = {}
    texts: dict[int, str] = {}
    k = _logprob_k(body, surface)
    for chunk in chunks:
        if chunk.get("object") != ("chat.completion.chunk" if chat else "text_completion"):
            problems.append(f"chunk object {chunk.get('object')!r}")
        for c in chunk["choices"]:
            piece = (c["delta"].get("content") or "") if chat else c.get("text", "")
            texts[c["index"]] = texts.get(c["index"], "") + piece
            if c.get("finish_reason") is not None:
                finishes.setdefault(c["index"], []).append(c["finish_reason"])
            if piece and c.get("logprobs") is not None and k is None:
                problems.append("logprobs in a chunk that did not ask for them")
            if piece and k is not None and c.get("logprobs") is None:
                problems.append(f"a chunk with text but no logprobs (asked {k})")
    if sorted(finishes) != list(range(n)) or any(len(f) != 1 for f in finishes.values()):
        problems.append(f"finish_reason per choice {finishes} for n={n}")
    for index, text in texts.items():
        problems += _check_text(text, _stops(body), f"streamed choice {index}")
    usage_chunks = [c for c in chunks if c.get("usage")]
    if include_usage:
        if not usage_chunks or usage_chunks[-1] is not chunks[-1] or chunks[-1]["choices"]:
            problems.append("include_usage: no final usage chunk with choices []")
        else:
            problems += _check_usage(chunks[-1]["usage"], n * _budget(body, surface))
        if any("usage" not in c for c in chunks):
            problems.append("include_usage: a chunk without the usage key")
    elif usage_chunks:
        problems.append("usage chunk without stream_options.include_usage")
    return problems


# ---- Anthropic messages

def _messages(body: dict, reply: dict, outcome: Outcome) -> list[str]:
    problems = []
    if reply.get("type") != "message" or reply.get("role") != "assistant" or not reply["id"].startswith("msg_"):
        problems.append(f"not a message: type {reply.get('type')!r}, id {reply.get('id')!r}")
    if reply["stop_reason"] not in ANTHROPIC_STOPS:
        problems.append(f"stop_reason {reply['stop_reason']!r}")
    if reply["stop_reason"] == "stop_sequence" and reply.get("stop_sequence") not in body.get("stop_sequences", []):
        problems.append(f"stop_sequence {reply.get('stop_sequence')!r} was not asked for")
    text = "".join(b["text"] for b in reply["content"] if b["type"] == "text")
    problems += _check_text(text, _stops(body, "stop_sequences"), "content")
    if any(b["type"] not in ("text", "tool_use") for b in reply["content"]):
        problems.append("a content block neither text nor tool_use")
    return problems + _check_usage(reply["usage"], _budget(body, "messages"), "input_tokens", "output_tokens")


def _messages_stream(body: dict, outcome: Outcome) -> list[str]:
    events = outcome.events
    names = [e.name for e in events]
    if "error" in names:
        return [f"error event: {events[names.index('error')].data[:200]}"]
    problems = [f"event {name!r}" for name in names if name not in ANTHROPIC_EVENTS]
    if not names or names[0] != "message_start" or names[-1] != "message_stop":
        return problems + [f"events run {names[:1]} ... {names[-1:]}, not message_start ... message_stop"]
    problems += [f"event {e.name} carries type {e.json().get('type')!r}" for e in events if e.json().get("type") != e.name]
    deltas = [e.json() for e in events if e.name == "message_delta"]
    if len(deltas) != 1 or deltas[0]["delta"]["stop_reason"] not in ANTHROPIC_STOPS:
        problems.append(f"message_delta events {deltas}")
    else:
        problems += _check_usage({"input_tokens": 1, **deltas[0]["usage"]}, _budget(body, "messages"),
                                 "input_tokens", "output_tokens")
    if names.count("content_block_start") != names.count("content_block_stop"):
        problems.append("content blocks started and stopped differ")
    text = "".join(e.json()["delta"].get("text", "") for e in events if e.name == "content_block_delta")
    return problems + _check_text(text, _stops(body, "stop_sequences"), "streamed content")


def _count_tokens(body: dict, reply: dict, outcome: Outcome) -> list[str]:
    return [] if isinstance(reply.get("input_tokens"), int) and reply["input_tokens"] >= 1 else [f"reply {reply}"]


# ---- OpenAI Responses

def _responses(body: dict, reply: dict, outcome: Outcome) -> list[str]:
    problems = _response_object(body, reply)
    return problems + _stored(body, outcome)


def _response_object(body: dict, reply: dict) -> list[str]:
    problems = []
    if reply.get("object") != "response" or not reply["id"].startswith("resp_"):
        problems.append(f"not a response: object {reply.get('object')!r}, id {reply.get('id')!r}")
    if reply["status"] not in ("completed", "incomplete"):
        problems.append(f"status {reply['status']!r} ({reply.get('error')})")
    if reply["status"] == "incomplete" and (reply.get("incomplete_details") or {}).get("reason") != "max_output_tokens":
        problems.append(f"incomplete_details {reply.get('incomplete_details')!r}")
    if any(item["type"] not in ("message", "function_call") for item in reply["output"]):
        problems.append("an output item neither message nor function_call")
    return problems + _check_usage(reply["usage"], _budget(body, "responses"), "input_tokens", "output_tokens")


def _stored(body: dict, outcome: Outcome) -> list[str]:
    want = 404 if body.get("store") is False else 200
    if outcome.stored_status != want:
        return [f"GET /v1/responses/{{id}} is {outcome.stored_status}, expected {want} (store={body.get('store')})"]
    return []


def _responses_stream(body: dict, outcome: Outcome) -> list[str]:
    events = outcome.events
    data = [e.json() for e in events]
    names = [e.name for e in events]
    if "response.failed" in names or "error" in names:
        return [f"failure event: {events[-1].data[:200]}"]
    problems = [f"event {e.name} carries type {d.get('type')!r}" for e, d in zip(events, data, strict=True)
                if d.get("type") != e.name]
    if [d.get("sequence_number") for d in data] != list(range(len(data))):
        problems.append("sequence_number does not count from 0")
    if not names or names[0] != "response.created" or names[-1] not in ("response.completed", "response.incomplete"):
        return problems + [f"events run {names[:1]} ... {names[-1:]}"]
    return problems + _response_object(body, data[-1]["response"]) + _stored(body, outcome)


# ---- embeddings and the vLLM utilities

def _embeddings(body: dict, reply: dict, outcome: Outcome) -> list[str]:
    given = body["input"]
    inputs = 1 if isinstance(given, str) or (given and isinstance(given[0], int)) else len(given)
    width = body.get("dimensions") or HIDDEN
    problems = [] if len(reply["data"]) == inputs else [f"{len(reply['data'])} embeddings for {inputs} inputs"]
    for item in reply["data"]:
        vector = item["embedding"]
        size = len(base64.b64decode(vector)) // 4 if isinstance(vector, str) else len(vector)
        if size != width:
            problems.append(f"embedding of {size} values, expected {width}")
    return problems


def _tokenize(body: dict, reply: dict, outcome: Outcome) -> list[str]:
    problems = [] if reply["count"] == len(reply["tokens"]) else [f"count {reply['count']} != {len(reply['tokens'])}"]
    if body.get("return_token_strs") and len(reply.get("token_strs") or []) != reply["count"]:
        problems.append("token_strs missing or of another length")
    return problems


def _detokenize(body: dict, reply: dict, outcome: Outcome) -> list[str]:
    return [] if isinstance(reply.get("prompt"), str) else [f"reply {reply}"]


_REPLIES = {"chat.completions": _chat, "completions": _completions, "messages": _messages,
            "messages.count_tokens": _count_tokens, "responses": _responses, "embeddings": _embeddings,
            "tokenize": _tokenize, "detokenize": _detokenize}
_STREAMS = {"chat.completions": lambda b, o: _openai_stream(b, o, "chat.completions"),
            "completions": lambda b, o: _openai_stream(b, o, "completions"),
            "messages": _messages_stream, "responses": _responses_stream}
