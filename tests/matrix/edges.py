"""Boundary values of the contract's declared bounds, on every generating surface: each sampling
field at its bounds, just inside an open bound, and the values a double holds but the contract's
float32 does not (a positive number below float32's smallest subnormal rounds to 0). They are
valid by the published schemas (docs/schemas: `exclusiveMinimum: 0` admits 1e-46), so they get
the schema-drawn bodies' properties: a 200, or a 4xx in the surface's shape naming the field as
the client spelled it; never a 5xx, never an internal field path.

Random draws found the float32 case once (`"repetition_penalty": 5e-324` on chat was refused
naming `frames[0].preprocess_input.model_kwargs.sampling.repetition_penalty`); these keep it and
its neighbours in every run. Bounds are read from the contract (services.common.sampling_fields).
"""

from __future__ import annotations

from typing import Any

from services.common.sampling_fields import FIELDS

TINY = 1e-46  # > 0 as a double, 0 as a float32


def _values(name: str) -> list[float | int]:
    """The interesting values of one sampling field: its bounds, just inside open ones, TINY."""
    b = FIELDS[name].bounds
    out: list[float | int] = []
    for edge, inclusive, step in ((b.low, b.low_inclusive, 1), (b.high, b.high_inclusive, -1)):
        if edge is None:
            continue
        if inclusive:
            out.append(edge)
        elif isinstance(edge, float) or FIELDS[name].kind is float:
            out += [edge + step * 1e-6, edge + step * TINY] if edge == 0 else [edge + step * 1e-6]
        else:
            out.append(edge + step)
    return out


# The float sampling fields each surface offers, by the name it shares with the domain field.
_FLOATS = {
    "chat.completions": ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                         "frequency_penalty"),
    "completions": ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                    "frequency_penalty"),
    "messages": ("temperature", "top_p"),
    "responses": ("temperature", "top_p"),
}
_BASE = {
    "chat.completions": {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
    "completions": {"model": "default", "prompt": "Hi", "max_tokens": 1},
    "messages": {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
    "responses": {"model": "default", "input": "Hi", "max_output_tokens": 1},
}


def edge_bodies(surface: str) -> list[dict[str, Any]]:
    base = _BASE[surface]
    out = [{**base, name: value} for name in _FLOATS[surface] for value in _values(name)]
    if surface in ("chat.completions", "completions"):
        seed = FIELDS["seed"].int_range
        out += [{**base, "seed": seed[0]}, {**base, "seed": seed[1]}, {**base, "n": FIELDS["n"].bounds.high}]
        stops = FIELDS["stop"].bounds
        out.append({**base, "stop": ["x" * stops.items.max_len] * stops.max_items})
        out.append({**base, "top_k": FIELDS["top_k"].bounds.high})
    if surface == "chat.completions":
        out.append({**base, "logprobs": True, "top_logprobs": FIELDS["logprobs"].bounds.high})
    if surface == "completions":
        out.append({**base, "logprobs": FIELDS["logprobs"].bounds.high})
    if surface == "messages":
        out += [{**base, "top_k": 0}, {**base, "stop_sequences": ["x"] * FIELDS["stop"].bounds.max_items}]
    return out
