"""How each API surface spells the sampling fields: its naming scheme, a field's public names and
aliases, and where SamplingParams sits in a native request.

The field table itself (type, default, bounds from the contract) is the engine's and lives in
services/common/sampling_fields.py; the names are the surfaces' business and live here, so the
generation service never learns that OpenAI chat calls max_tokens `max_completion_tokens`
(tests/unit/test_import_floors.py holds that). An error names the field the client spelled.

    public_names("max_tokens", CHAT)   # ("max_completion_tokens", "max_tokens"): name, then aliases
    public_name("stop", MESSAGES)      # "stop_sequences"
    offered(RESPONSES)                 # the table rows a Responses body accepts
"""

from __future__ import annotations

from services.common.sampling_fields import FIELDS, SamplingField

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
_OPENAI = (CHAT, COMPLETIONS)


def _everywhere(name: str) -> dict[str, tuple[str, ...]]:
    return {s: (name,) for s in (CHAT, COMPLETIONS, MESSAGES, RESPONSES)}


def _openai(name: str) -> dict[str, tuple[str, ...]]:
    return {s: (name,) for s in _OPENAI}


# Public names per field and scheme; a scheme missing from a row does not offer the field. Several
# names = aliases of one field (OpenAI chat: max_completion_tokens, the deprecated max_tokens).
NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "temperature": _everywhere("temperature"),
    "top_p": _everywhere("top_p"),
    "top_k": {**_openai("top_k"), MESSAGES: ("top_k",)},
    "min_p": _openai("min_p"),
    "repetition_penalty": _openai("repetition_penalty"),
    "frequency_penalty": _openai("frequency_penalty"),
    "presence_penalty": _openai("presence_penalty"),
    "seed": _openai("seed"),
    "max_tokens": {CHAT: ("max_completion_tokens", "max_tokens"), COMPLETIONS: ("max_tokens",),
                   MESSAGES: ("max_tokens",), RESPONSES: ("max_output_tokens",)},
    "stop": {**_openai("stop"), MESSAGES: ("stop_sequences",)},
    "stop_token_ids": _openai("stop_token_ids"),
    "ignore_eos": _openai("ignore_eos"),
    "logprobs": {CHAT: ("top_logprobs",), COMPLETIONS: ("logprobs",)},
    "include_stop": _openai("include_stop_str_in_output"),
    "n": _openai("n"),
    "speculative": {},  # the native API's alone (no peer API has it)
}


def native_prefix(surface: str) -> str:
    """Where SamplingParams sits in a native request (error paths: input.model_kwargs.sampling.stop[0])."""
    return ("start" if surface == "Session" else "input") + ".model_kwargs.sampling."


def scheme_of(surface: str) -> str:
    """The naming scheme of a surface label (a native RPC name, or one of SCHEMES)."""
    if surface in NATIVE_SURFACES or surface == NATIVE:
        return NATIVE
    if surface not in SCHEMES:
        raise KeyError(f"unknown surface {surface!r}")
    return surface


def public_names(name: str, surface: str) -> tuple[str, ...]:
    """Every public name of domain field `name` on `surface`, canonical first; () = not offered."""
    scheme = scheme_of(surface)
    if scheme == NATIVE:
        return (native_prefix(surface) + FIELDS[name].wire_name,)
    return NAMES[name].get(scheme, ())


def public_name(name: str, surface: str) -> str:
    """How a client of `surface` spells domain field `name` (its canonical name); errors use it."""
    names = public_names(name, surface)
    if not names:
        raise KeyError(f"{surface} has no field for sampling.{name}")
    return names[0]


def offered(surface: str) -> list[SamplingField]:
    """The fields a surface accepts, in table order."""
    return [f for f in FIELDS.values() if public_names(f.name, surface)]
