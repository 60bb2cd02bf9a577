"""OpenAI `/v1/chat/completions` and `/v1/completions` request bodies → a validated `OpenAIRequest`.

Unknown fields: the body arrives raw (HttpBody), so nothing is silently dropped. Every top-level
key is either
  - supported (mapped onto PreprocessInput / SamplingParams),
  - IGNORED: known OpenAI fields with no effect on the output of a self-hosted model (accepted so
    the official client and existing code keep working),
  - UNSUPPORTED: known OpenAI fields that would change the output and that mstar cannot honour —
    400 UNSUPPORTED_FIELD unless given a neutral value (null, false, {}, [], "" or the default),
  - or unknown: 400 UNKNOWN_FIELD naming it (a typo like `max_token` must not be ignored).
docs/http.md lists the same sets; tests/unit/openai keeps them in sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mstar.v1 import messages_pb2 as pb

from services.common import errors
from services.common.contract import bounds
from services.preprocess.limits import DECLARED
from services.preprocess.openai import fields as f
from services.preprocess.openai.body import decode_json_object
from services.preprocess.request import Sampling

CHAT = "chat"
COMPLETION = "completion"

# The contract's declared bounds (protos/mstar/v1/messages.proto), so both API shapes agree.
MAX_N = int(DECLARED["n"].high)
MAX_STOP = DECLARED["stop"].max_items
MAX_STOP_LEN = DECLARED["stop"].items.max_len
MAX_STOP_TOKEN_IDS = DECLARED["stop_token_ids"].max_items
MAX_MESSAGES = bounds(pb.PreprocessInput, "messages").max_items
MAX_TOP_LOGPROBS = int(DECLARED["logprobs"].high)
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's own limit for the legacy endpoint
MAX_MODEL_LEN = bounds(pb.PreprocessInput, "model").max_len
# OpenAI's documented default for the legacy completions endpoint.
COMPLETION_DEFAULT_MAX_TOKENS = 16

SAMPLING = {
    "temperature",
    "top_p",
    "n",
    "seed",
    "stop",
    "max_tokens",
    "presence_penalty",
    "frequency_penalty",
    # Extensions (vLLM-compatible names): not in OpenAI's API, common in self-hosted servers.
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "stop_token_ids",
    "include_stop_str_in_output",
}
SUPPORTED = {
    CHAT: SAMPLING
    | {"model", "stream", "stream_options", "messages", "max_completion_tokens", "logprobs", "top_logprobs"},
    COMPLETION: SAMPLING | {"model", "stream", "stream_options", "prompt", "logprobs"},
}
IGNORED = {
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
}
UNSUPPORTED = {
    CHAT: {
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "response_format",
        "logit_bias",
        "audio",
        "modalities",
        "prediction",
        "reasoning_effort",
        "web_search_options",
        "verbosity",
    },
    COMPLETION: {"echo", "suffix", "best_of", "logit_bias"},
}
# Values of UNSUPPORTED fields that ask for the default behaviour, so they are harmless.
NEUTRAL = {
    "tool_choice": ("none",),
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MESSAGE_KEYS = {"role", "content", "name"}


@dataclass
class OpenAIRequest:
    kind: str
    model: str = ""
    messages: list[tuple[str, str]] = field(default_factory=list)
    prompt_text: str | None = None
    prompt_token_ids: list[int] | None = None
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    sampling: Sampling = field(default_factory=Sampling)


def parse(kind: str, data: bytes, content_type: str) -> OpenAIRequest:
    """Validate a request body of endpoint `kind` (CHAT or COMPLETION); raises MstarError (400)."""
    body = decode_json_object(data, content_type)
    _check_keys(kind, body)
    req = OpenAIRequest(kind=kind)
    req.model = f.get_str(body, "model", max_len=MAX_MODEL_LEN) or ""
    req.stream = bool(f.get_bool(body, "stream"))
    options = f.get_object(body, "stream_options") or {}
    for key in options:
        if key not in ("include_usage", "continuous_usage_stats"):
            raise errors.invalid_argument(
                f"stream_options.{errors.field_name(key)}", "unknown field", reason="UNKNOWN_FIELD")
    req.include_usage = bool(f.get_bool(options, "include_usage", prefix="stream_options"))
    req.n = f.get_int(body, "n", lo=1, hi=MAX_N) or 1
    if kind == CHAT:
        req.messages = _messages(body)
        max_tokens, logprobs = _chat_max_tokens(body), _chat_logprobs(body)
    else:
        req.prompt_text, req.prompt_token_ids = _prompt(body)
        given = f.get_int(body, "max_tokens", lo=1, hi=int(DECLARED["max_tokens"].high))
        max_tokens = COMPLETION_DEFAULT_MAX_TOKENS if given is None else given
        logprobs = f.get_int(body, "logprobs", lo=0, hi=MAX_COMPLETION_LOGPROBS)
        best_of = f.get_int(body, "best_of", lo=1, hi=MAX_N)
        if best_of is not None and best_of != req.n:
            raise errors.invalid_argument(
                "best_of", "only best_of == n is supported", reason="UNSUPPORTED_FIELD"
            )
    req.sampling = _sampling(body, max_tokens=max_tokens, logprobs=logprobs)
    return req


def _check_keys(kind: str, body: dict) -> None:
    for key in body:
        if key in SUPPORTED[kind] or key in IGNORED:
            continue
        if key in UNSUPPORTED[kind]:
            if _is_neutral(key, body[key]):
                continue
            raise errors.invalid_argument(key, "not supported by this server", reason="UNSUPPORTED_FIELD")
        raise errors.invalid_argument(errors.field_name(key), "unknown field", reason="UNKNOWN_FIELD")


def _is_neutral(key: str, value: object) -> bool:
    if value in (None, False, {}, [], ""):
        return True
    if key == "best_of":  # checked against n after parsing
        return True
    return value in NEUTRAL.get(key, ())


def _declared_float(body: dict, name: str) -> float | None:
    b = DECLARED[name]
    return f.get_float(body, name, lo=b.low, hi=b.high, lo_open=not b.low_inclusive)


def _sampling(body: dict, *, max_tokens: int | None, logprobs: int | None) -> Sampling:
    top_k = f.get_int(body, "top_k", lo=-1, hi=int(DECLARED["top_k"].high))
    return Sampling(
        temperature=_declared_float(body, "temperature"),
        top_p=_declared_float(body, "top_p"),
        top_k=0 if top_k == -1 else top_k,  # vLLM spells "off" as -1; mstar as 0
        min_p=_declared_float(body, "min_p"),
        repetition_penalty=_declared_float(body, "repetition_penalty"),
        frequency_penalty=_declared_float(body, "frequency_penalty"),
        presence_penalty=_declared_float(body, "presence_penalty"),
        seed=f.get_int(body, "seed", lo=-(2**63), hi=f.INT64_MAX),
        max_tokens=max_tokens,
        logprobs=logprobs,
        stop=tuple(f.get_stop(body, "stop", max_count=MAX_STOP, max_len=MAX_STOP_LEN)),
        stop_token_ids=tuple(
            f.get_int_list(body, "stop_token_ids", max_count=MAX_STOP_TOKEN_IDS, lo=0, hi=f.INT32_MAX)
        ),
        ignore_eos=bool(f.get_bool(body, "ignore_eos")),
        include_stop=bool(f.get_bool(body, "include_stop_str_in_output")),
    )


def _chat_max_tokens(body: dict) -> int | None:
    # max_completion_tokens is OpenAI's current name, max_tokens the deprecated one; both work.
    new = f.get_int(body, "max_completion_tokens", lo=1, hi=int(DECLARED["max_tokens"].high))
    old = f.get_int(body, "max_tokens", lo=1, hi=int(DECLARED["max_tokens"].high))
    if new is not None and old is not None and new != old:
        raise errors.invalid_argument("max_tokens", "conflicts with max_completion_tokens; send only one")
    return new if new is not None else old


def _chat_logprobs(body: dict) -> int | None:
    wanted = f.get_bool(body, "logprobs")
    top = f.get_int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise errors.invalid_argument("top_logprobs", "requires logprobs: true")
    return (top or 0) if wanted else None


def _messages(body: dict) -> list[tuple[str, str]]:
    value = body.get("messages")
    if value is None:
        raise errors.invalid_argument("messages", "required")
    if not isinstance(value, list) or not value:
        raise errors.invalid_argument("messages", "must be a non-empty array of message objects")
    if len(value) > MAX_MESSAGES:
        raise errors.invalid_argument("messages", f"at most {MAX_MESSAGES} messages")
    return [_message(i, m) for i, m in enumerate(value)]


def _message(i: int, m: object) -> tuple[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise errors.invalid_argument(where, f"must be an object, got {f.type_name(m)}")
    for key in m:
        if key not in MESSAGE_KEYS and m[key] not in (None, [], ""):
            raise errors.invalid_argument(
                f"{where}.{errors.field_name(key)}", "not supported by this server", reason="UNSUPPORTED_FIELD"
            )
    role = m.get("role")
    if role not in ROLES:
        raise errors.invalid_argument(f"{where}.role", f"must be one of {sorted(ROLES)}, got {errors.quote(role)}")
    return ROLES[role], _content(where, role, m.get("content"))


def _content(where: str, role: str, content: object) -> str:
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""
    if not isinstance(content, list):
        raise errors.invalid_argument(f"{where}.content", "must be a string or an array of text parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise errors.invalid_argument(
                f"{where}.content[{j}]", 'only {"type": "text", "text": string} parts are supported'
            )
        texts.append(part["text"])
    return "".join(texts)


def _prompt(body: dict) -> tuple[str | None, list[int] | None]:
    """A string, a one-element list of a string, a token id list, or a one-element list of one."""
    value = body.get("prompt")
    if value is None:
        raise errors.invalid_argument("prompt", "required")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        return value, None
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        f.get_int_list({"prompt": value}, "prompt", max_count=10**6, lo=0, hi=f.INT32_MAX)
        return None, list(value)
    raise errors.invalid_argument(
        "prompt",
        "must be a string or a token id array (batched prompts are not supported; send one per request)",
    )
