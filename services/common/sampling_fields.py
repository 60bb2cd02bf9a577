"""The sampling spec as one declarative table: every field's type, default, bounds and public names.

One row per field of the domain `Sampling` (services/preprocess/request.py), which is also a field
of the contract's `mstar.v1.SamplingParams`. The bounds are NOT written here: they are read from
the contract's declared protovalidate rules (`services.common.contract.bounds`), so the OpenAI,
Anthropic and Responses readers, preprocess and the engine check the same numbers. Each API
surface names the field its own way (`stop` / `stop_sequences`, `max_tokens` /
`max_output_tokens`), and an error names it the way the client spelled it.

    field = FIELDS["max_tokens"]
    field.public_names("responses")   # ("max_output_tokens",)
    field.bounds                      # Bounds(low=1, high=1048576, ...) from the .proto
    public_name("stop", "messages")   # "stop_sequences"

No protobuf message, grpc or torch is used here; only the contract's descriptor is read (lazily).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

# Naming schemes. The native RPCs (Generate, GenerateStream, Session) share the proto's names.
NATIVE = "native"
CHAT = "chat.completions"
COMPLETIONS = "completions"
MESSAGES = "messages"
RESPONSES = "responses"
TOKENIZE = "tokenize"  # /tokenize: no sampling fields
EMBEDDINGS = "embeddings"  # /v1/embeddings: no sampling fields
SCHEMES = (NATIVE, CHAT, COMPLETIONS, MESSAGES, RESPONSES, TOKENIZE, EMBEDDINGS)
NATIVE_SURFACES = ("Generate", "GenerateStream", "Session")


def native_prefix(surface: str) -> str:
    """Where SamplingParams sits in a native request (error paths: input.model_kwargs.sampling.stop[0])."""
    return ("start" if surface == "Session" else "input") + ".model_kwargs.sampling."

_OPENAI = (CHAT, COMPLETIONS)


@dataclass(frozen=True)
class SamplingField:
    name: str  # attribute of the domain Sampling
    kind: type  # JSON/Python type of one value: float, int, bool, or str for lists of strings
    default: Any  # what "unset" means (applied by the generation service)
    doc: str
    # Public names per naming scheme; a scheme missing here does not offer the field. Several
    # names = aliases of one field (OpenAI chat: max_completion_tokens, the deprecated max_tokens).
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    contract: str = ""  # field name in mstar.v1.SamplingParams (default: `name`)
    repeated: bool = False

    def public_names(self, surface: str) -> tuple[str, ...]:
        scheme = scheme_of(surface)
        if scheme == NATIVE:
            return (native_prefix(surface) + (self.contract or self.name),)
        return self.names.get(scheme, ())

    @property
    def bounds(self):
        """The contract's declared bounds (services.common.contract.Bounds)."""
        return _bounds(self.contract or self.name)

    @property
    def is_float32(self) -> bool:
        """The contract carries it as a 32-bit float: a JSON double is rounded on the wire."""
        return self.kind is float and _is_float32(self.contract or self.name)

    @property
    def int_range(self) -> tuple[int, int] | None:
        """What the contract's integer type can hold (int32 / int64), for integer fields."""
        return _int_range(self.contract or self.name) if self.kind is int else None


def _descriptor():
    from mstar.v1 import messages_pb2

    return messages_pb2.SamplingParams.DESCRIPTOR


@functools.cache
def _bounds(contract_field: str):
    from services.common import contract

    return contract.bounds(_descriptor(), contract_field)


@functools.cache
def _int_range(contract_field: str) -> tuple[int, int]:
    from google.protobuf.descriptor import FieldDescriptor

    bits = 64 if _descriptor().fields_by_name[contract_field].type == FieldDescriptor.TYPE_INT64 else 32
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


@functools.cache
def _is_float32(contract_field: str) -> bool:
    from google.protobuf.descriptor import FieldDescriptor

    return _descriptor().fields_by_name[contract_field].type == FieldDescriptor.TYPE_FLOAT


def _everywhere(name: str) -> dict[str, tuple[str, ...]]:
    return {s: (name,) for s in (CHAT, COMPLETIONS, MESSAGES, RESPONSES)}


def _openai(name: str) -> dict[str, tuple[str, ...]]:
    return {s: (name,) for s in _OPENAI}


_ROWS = (
    SamplingField("temperature", float, 1.0, "Softmax temperature; 0 = greedy.", _everywhere("temperature")),
    SamplingField("top_p", float, 1.0, "Nucleus sampling mass; 1 = off.", _everywhere("top_p")),
    SamplingField("top_k", int, 0, "Keep the k most likely tokens; 0 = off (OpenAI surfaces: -1 too).",
                  {**_openai("top_k"), MESSAGES: ("top_k",)}),
    SamplingField("min_p", float, 0.0, "Drop tokens below min_p x the top token's probability; 0 = off.",
                  _openai("min_p")),
    SamplingField("repetition_penalty", float, 1.0, "CTRL-style penalty on prompt and output tokens; 1 = off.",
                  _openai("repetition_penalty")),
    SamplingField("frequency_penalty", float, 0.0, "Subtracted per previous occurrence in the output.",
                  _openai("frequency_penalty")),
    SamplingField("presence_penalty", float, 0.0, "Subtracted once if the token occurred in the output.",
                  _openai("presence_penalty")),
    SamplingField("seed", int, None, "Same seed and input, same tokens; unset = random.", _openai("seed")),
    SamplingField("max_tokens", int, None, "Most tokens to generate; unset = what fits (server-capped).",
                  {CHAT: ("max_completion_tokens", "max_tokens"), COMPLETIONS: ("max_tokens",),
                   MESSAGES: ("max_tokens",), RESPONSES: ("max_output_tokens",)}),
    SamplingField("stop", str, (), "Stop strings, matched on the decoded text; not part of the output.",
                  {**_openai("stop"), MESSAGES: ("stop_sequences",)}, repeated=True),
    SamplingField("stop_token_ids", int, (), "Token ids that end the output (besides EOS).",
                  _openai("stop_token_ids"), repeated=True),
    SamplingField("ignore_eos", bool, False, "Keep generating past EOS (benchmarks).", _openai("ignore_eos")),
    SamplingField("logprobs", int, None, "Alternatives reported with each token's logprob; unset = none.",
                  {CHAT: ("top_logprobs",), COMPLETIONS: ("logprobs",)}),
    SamplingField("include_stop", bool, False, "Keep the matched stop string in the output.",
                  _openai("include_stop_str_in_output"), contract="include_stop_str_in_output"),
    SamplingField("n", int, 1, "Independent completions of one request.", _openai("n")),
)
FIELDS: dict[str, SamplingField] = {row.name: row for row in _ROWS}


def scheme_of(surface: str) -> str:
    """The naming scheme of a surface label (a native RPC name, or one of SCHEMES)."""
    if surface in NATIVE_SURFACES or surface == NATIVE:
        return NATIVE
    if surface not in SCHEMES:
        raise KeyError(f"unknown surface {surface!r}")
    return surface


def public_name(name: str, surface: str) -> str:
    """How a client of `surface` spells domain field `name` (its canonical name); errors use it."""
    names = FIELDS[name].public_names(surface)
    if not names:
        raise KeyError(f"{surface} has no field for sampling.{name}")
    return names[0]


def offered(surface: str) -> list[SamplingField]:
    """The fields a surface accepts, in table order."""
    return [f for f in _ROWS if f.public_names(surface)]
