"""Domain types of one request as the preprocess service handles it (no protobuf here).

The servicer turns wire messages into these (services/preprocess/wire.py) and the events a
request produces back into wire messages.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from services.common.errors import MstarError
from services.common.finish import FinishReason
from services.common.structured_output import StructuredOutput
from services.preprocess.chat_template import ChatMessage
from services.preprocess.tools import Tool

# Modality names used inside the service (wire enum values map onto these in wire.py).
TEXT = "text"
TOKENS = "tokens"
IMAGE = "image"


@dataclass(frozen=True)
class Part:
    """One prompt part or appended chunk, in arrival order."""

    modality: str
    text: str | None = None
    data: bytes | None = None
    file_path: str | None = None
    token_ids: tuple[int, ...] | None = None
    mime_type: str = ""


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters as given; None = unset (the generation service applies defaults)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop: bool = False
    n: int | None = None
    speculative: bool | None = None
    structured_output: StructuredOutput | None = None  # None = free text
    # The alias the client sent where a field has several public names (OpenAI chat's
    # `max_tokens` for `max_completion_tokens`): (field, public name) pairs, so an error or a
    # warning names the field the client wrote (surfaces/fields.py sets it).
    spelled: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EmbeddingSpec:
    """An embedding request: prefill only, one pooled, unit-length vector back (a Tensor event)."""

    dimensions: int | None = None  # None = the model's hidden size


def new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class RequestSpec:
    """A request to start: from a native PreprocessInput (wire.py) or an HTTP surface's body."""

    request_id: str = field(default_factory=new_request_id)
    client_request_id: str = ""
    model: str = ""
    text: str = ""
    messages: tuple[ChatMessage, ...] = ()
    tools: tuple[Tool, ...] = ()  # rendered into the prompt by the chat template (tools.py)
    parts: tuple[Part, ...] = ()
    # Input streams still open after this message (empty = one-shot request).
    open_inputs: frozenset[str] = frozenset()
    sampling: Sampling = field(default_factory=lambda: Sampling())
    extra_keys: tuple[str, ...] = ()
    upload_bytes: int = 0
    # Error field renames, (engine path prefix, public name) pairs, longest prefix first: the engine
    # names its constraint `structured_output.*`; a surface maps that onto what its client sent
    # (`response_format.json_schema.schema`, `tools[2].function.parameters`).
    field_renames: tuple[tuple[str, str], ...] = ()
    # Set: an embedding request (no sampling; the events are Accepted, Tensor, Complete).
    embedding: EmbeddingSpec | None = None
    # Who asked: the metrics/log label ("chat.completions", "messages", "GenerateStream", ...),
    # which also picks the field names errors use (services/preprocess/sampling_fields.py).
    surface: str = "GenerateStream"


@dataclass(frozen=True)
class AppendSpec:
    """More input for a running request (ClientAppend)."""

    request_id: str
    parts: tuple[Part, ...]
    ends: frozenset[str]
    upload_bytes: int = 0


@dataclass(frozen=True)
class TokenLogprobs:
    logprob: float
    top_token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


# ---- events a request emits, in order: Accepted, (KeepAlive | Chunk | Tensor)*, Profile, Complete | Failed


@dataclass(frozen=True)
class Accepted:
    request_id: str
    client_request_id: str
    prompt_tokens: int
    max_tokens: int
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class KeepAlive:
    request_id: str


@dataclass(frozen=True)
class Chunk:
    request_id: str
    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True)
class Tensor:
    """A tensor output of a request: an embedding (float32 little-endian bytes, shape (dimensions,))."""

    request_id: str
    data: bytes
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class InputInfo:
    modality: str
    size_bytes: int
    num_tokens: int
    mime_type: str = ""


@dataclass(frozen=True)
class Profile:
    request_id: str
    dequeue_time: float
    preprocess_finish_time: float
    input_infos: tuple[InputInfo, ...]
    upload_sizes_bytes: tuple[int, ...]
    failed: bool = False


@dataclass(frozen=True)
class Complete:
    request_id: str
    finish_reason: FinishReason
    stop_reason: str
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    chunks: int
    tensors: int = 0  # Tensor events sent (an embedding request's one)
    timings_ms: dict[str, float] = field(default_factory=dict)
    conductor_times: dict[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # Where the request's time went, per stage of its path (RequestComplete.node_timings).
    node_timings_ms: dict[str, float] = field(default_factory=dict)
    # What reached the service for it: its PreprocessInput and ClientAppends.
    rx_messages: int = 0
    rx_bytes: int = 0


@dataclass(frozen=True)
class Failed:
    """Terminal for `request_id`; with an empty request_id, a refused Session action that ended
    nothing (see RequestFailed in protos/mstar/v1/messages.proto)."""

    request_id: str
    error: MstarError
    client_request_id: str = ""


Event = Accepted | KeepAlive | Chunk | Tensor | Profile | Complete | Failed
