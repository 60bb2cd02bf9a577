"""What every HTTP surface shares: the request and frame types, body parsing, SSE framing.

Bodies are pydantic v2 models derived from `Body` (extra="forbid", strict JSON types): an unknown
field is a 400 `UNKNOWN_FIELD`, a known field this server cannot honour is a 400
`UNSUPPORTED_FIELD` unless it carries a neutral value (`unsupported(...)`), and every other
mistake is a 400 `INVALID_FIELD` naming the field the way the client spelled it (`stop[0]`,
`messages[2].content[0].text`). `true` is not an integer, `"256"` is not a number, `1.5` is not an
integer; NaN/Infinity literals and lone UTF-16 surrogates are not JSON.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Union, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from services.common import errors
from services.common.contract import declared
from services.preprocess import json_text

JSON = "application/json"
SSE = "text/event-stream"

# A token id as the contract carries it (TokenIds.ids: an int32, at least its declared minimum):
# every surface's token-id inputs; the model's vocabulary is checked later.
TokenId = Annotated[int, Field(ge=int(declared("mstar.v1.TokenIds", "ids").items.low), le=2**31 - 1)]
# A tool call's id, which the client echoes back with the call's result.
CallId = Annotated[str, Field(min_length=1, max_length=256)]


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP request as a surface sees it (Envoy hands the raw body through)."""

    body: bytes = b""
    content_type: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    params: Mapping[str, str] = field(default_factory=dict)  # path parameters


@dataclass(frozen=True)
class Frame:
    """One piece of the response body. `headers` of the first frame become response headers."""

    data: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()


class Body(BaseModel):
    """Base of every request body model."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    def check(self) -> None:
        """Rules across fields, after parsing; raise `field_error` naming the client's field."""


def unsupported(*neutral: Any):
    """A known field this server cannot honour: accepted only when absent or neutral (null,
    false, {}, [], "" or one of `neutral`), else 400 UNSUPPORTED_FIELD."""

    def check(value: Any) -> Any:
        if value in (None, False, {}, [], "") or value in neutral:
            return value
        raise PydanticCustomError("unsupported_field", "not supported by this server")

    return Annotated[Any, AfterValidator(check)]


# Accepted and ignored: known fields with no effect on a self-hosted model's output.
Ignored = Any


def string_or_list(wrap: Callable[[str], dict], what: str) -> BeforeValidator:
    """A field that is a string or an array of items (message content, input): a string becomes
    one item, so errors point into the array instead of at a union."""

    def normalize(value: Any) -> Any:
        if isinstance(value, str):
            return [wrap(value)]
        if not isinstance(value, list):
            raise PydanticCustomError("list_type", "must be a string or an array of {what}", {"what": what})
        return value

    return BeforeValidator(normalize)


def only_types(allowed: tuple[str, ...], what: str) -> BeforeValidator:
    """An item whose `type` mstar does not support yet is a clear 400 UNSUPPORTED_FIELD."""

    def check(value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind not in allowed:
            raise PydanticCustomError(
                "unsupported_field", "{what} of type {kind} are not supported (only {allowed})",
                {"what": what, "kind": errors.quote(kind, 32), "allowed": ", ".join(allowed)},
            )
        return value

    return BeforeValidator(check)


def by_type(*members: type[Body]) -> Any:
    """A union of bodies picked by their JSON `type` (each member's `type` is a Literal). Its tags
    are written `type(<name>)`, which error paths leave out (`input[0].call_id`, not
    `input[0].function_call_output.call_id`)."""
    tags = {}
    options = []
    for member in members:
        names = get_args(member.model_fields["type"].annotation)
        tags.update({name: f"type({names[0]})" for name in names})
        options.append(Annotated[member, Tag(f"type({names[0]})")])

    def pick(value: Any) -> str | None:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return tags.get(kind) if isinstance(kind, str) else None

    return Annotated[Union[tuple(options)], Discriminator(pick)]  # noqa: UP007 (a runtime tuple of types)


def parse(model: type[Body], req: HttpRequest) -> Body:
    """The body as `model`, or a 400 naming the first offending field (all of them, bounded, in
    the BadRequest details)."""
    _check_content_type(req.content_type)
    if not req.body.strip():
        raise errors.invalid_argument("body", "empty request body; expected a JSON object", reason="INVALID_JSON")
    try:
        # Strict JSON first (NaN/Infinity literals and lone surrogates are not JSON, even in a
        # field that is ignored), then the model, with JSON's types kept strict.
        value = json_text.loads(req.body)
    except ValueError as exc:
        raise errors.invalid_argument("body", json_text.message(str(exc)), reason="INVALID_JSON") from None
    try:
        body = model.model_validate(value, strict=True)
    except ValidationError as exc:
        raise validation_error(exc) from None
    body.check()
    return body


def _check_content_type(content_type: str) -> None:
    # An absent Content-Type is tolerated (some clients omit it); a different one is a mistake,
    # typically curl's default application/x-www-form-urlencoded.
    media = content_type.split(";", 1)[0].strip().lower()
    if media and media != JSON and not (media.startswith("application/") and media.endswith("+json")):
        raise errors.invalid_argument(
            "body", "Content-Type must be application/json", reason="BAD_CONTENT_TYPE"
        )


_REASONS = {"extra_forbidden": "UNKNOWN_FIELD", "unsupported_field": "UNSUPPORTED_FIELD",
            "model_type": "INVALID_JSON"}
_MESSAGES = {"extra_forbidden": "unknown field", "missing": "required",
             "model_type": "must be a JSON object"}


def validation_error(exc: ValidationError) -> errors.MstarError:
    violations = []
    reason = "INVALID_FIELD"
    for i, e in enumerate(exc.errors(include_url=False, include_input=False)[:errors.MAX_VIOLATIONS]):
        kind = e["type"]
        path = path_of(e["loc"], client_key_last=kind == "extra_forbidden") or "body"
        message = _MESSAGES.get(kind) or _message(e)
        if i == 0:
            reason = _REASONS.get(kind, "INVALID_FIELD")
        violations.append(errors.FieldViolation(path, message))
    first = violations[0]
    return errors.MstarError(
        errors.Code.INVALID_ARGUMENT, reason, f"{first.field}: {first.description}",
        field_violations=violations, metadata={"field": first.field},
    )


def _message(e: dict) -> str:
    # pydantic's wording ("Input should be ...") reads as "must be ..." like the rest of mstar.
    msg = str(e["msg"])
    if msg.startswith("Input should be "):
        msg = "must be " + msg[len("Input should be "):]
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return msg


# Union members and validators appear in pydantic locations as type tags ("str", "list[int]",
# "function-after[...]"); they are not fields of the client's JSON.
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|dict|list)$|[\[(]")


def path_of(loc: tuple, client_key_last: bool = False) -> str:
    """A pydantic error location as a client-side path: `messages[2].content[0].text`.
    `client_key_last`: the last element is the client's own key (an unknown field), never a tag."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif _TYPE_TAG.search(str(part)) and not (client_key_last and i == len(loc) - 1):
            continue
        else:
            key = errors.field_name(str(part))  # a client's key: as is if plain, else short and quoted
            out = f"{out}.{key}" if out else key
    return out


def field_error(path: str, message: str, reason: str = "INVALID_FIELD") -> errors.MstarError:
    """A 400 for a rule pydantic cannot express (cross-field checks) naming the client's field."""
    return errors.invalid_argument(path, message, reason=reason)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def json_frame(obj: Any, headers: tuple[tuple[str, str], ...] = ()) -> Frame:
    return Frame(dumps(obj), JSON, headers)


# The response headers of every SSE stream (each SSE frame carries them; the first frame's
# become the response's). `no-cache`: no cache may store or replay a stream (OpenAI and vLLM send
# it too). `X-Accel-Buffering: no`: nginx, ingress-nginx included, buffers proxied responses by
# default and would hold events back until its buffer fills; this turns that off for the response,
# and every other proxy ignores it.
SSE_HEADERS = (("cache-control", "no-cache"), ("x-accel-buffering", "no"))


def sse_frame(data: bytes) -> Frame:
    """Bytes of an SSE stream, already framed (an event, a comment, OpenAI's `[DONE]`)."""
    return Frame(data, SSE, SSE_HEADERS)


def sse(obj: Any, event: str | None = None) -> Frame:
    """One Server-Sent Event: `event: <name>` (Anthropic, Responses) when given, then `data:`."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return sse_frame(head + b"data: " + dumps(obj) + b"\n\n")


SSE_COMMENT_KEEPALIVE = sse_frame(b": keep-alive\n\n")


class KeepAlivePacer:
    """Keeps an SSE stream from going silent while its request works, in the surface's own form
    (`frame`: an SSE comment, Anthropic's `ping` event).

    The run sends a KeepAlive event whenever the engine is silent for the keep-alive interval
    (queued, a slow step) or only prefilled the request in a step; each becomes a keep-alive. A
    surface can also take in events for a long time without writing a byte (the tool-call parser
    holds a call's text until the call is complete): every other event that writes nothing gets a
    keep-alive once the stream has been silent for the interval.
    """

    def __init__(self, interval_s: float, frame: Frame, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.frame = frame
        self._clock = clock
        self._last = clock()

    def pace(self, frames: list[Frame], keepalive: bool = False) -> list[Frame]:
        """What to write for one event: its own frames; else a keep-alive for a KeepAlive event
        (`keepalive`) or once the stream has been silent for the interval; else nothing."""
        now = self._clock()
        if frames:
            self._last = now
            return frames
        if keepalive or now - self._last >= self.interval_s:
            self._last = now
            return [self.frame]
        return []
