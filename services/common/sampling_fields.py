"""The sampling spec as one declarative table: every field's type, default and bounds.

One row per field of the domain `Sampling` (services/preprocess/request.py), which is also a field
of the contract's `mstar.v1.SamplingParams`; the rows the engine samples with (`engine`) are the
fields of its `SamplingParams` (services/generation/sampling_params.py), and both services' wire
converters (services/common/sampling_wire.py) walk these rows instead of keeping name lists. The
bounds are NOT written here: they are read from the contract's declared protovalidate rules
(`services.common.contract.bounds`), so every surface, preprocess and the engine check the same
numbers. How each API surface spells a field (`stop_sequences`, `max_output_tokens`) is the
surfaces' business: services/preprocess/surfaces/sampling_names.py.

    field = FIELDS["max_tokens"]
    field.bounds                      # Bounds(low=1, high=1048576, ...) from the .proto
    [f.name for f in ENGINE_FIELDS]   # what the generation service samples with

No protobuf message, grpc or torch is used here; only the contract's descriptor is read (lazily).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingField:
    name: str  # attribute of the domain Sampling (and of the engine's SamplingParams when `engine`)
    kind: type  # JSON/Python type of one value: float, int, bool, or str for lists of strings
    default: Any  # what "unset" means (applied by the generation service)
    doc: str
    contract: str = ""  # field name in mstar.v1.SamplingParams (default: `name`)
    repeated: bool = False
    engine: bool = True  # False: preprocess's alone (stop strings, n's fan-out), never sent to the engine

    @property
    def wire_name(self) -> str:
        """The field's name in mstar.v1.SamplingParams."""
        return self.contract or self.name

    @property
    def is_number(self) -> bool:
        """A scalar int or float (a bool is its own kind): what gets a range check."""
        return self.kind in (int, float) and not self.repeated

    @property
    def bounds(self):
        """The contract's declared bounds (services.common.contract.Bounds)."""
        return _bounds(self.wire_name)

    @property
    def is_float32(self) -> bool:
        """The contract carries it as a 32-bit float: a JSON double is rounded on the wire."""
        return self.kind is float and _is_float32(self.wire_name)

    @property
    def int_range(self) -> tuple[int, int] | None:
        """What the contract's integer type can hold (int32 / int64), for integer fields."""
        return _int_range(self.wire_name) if self.kind is int else None


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


_ROWS = (
    SamplingField("temperature", float, 1.0, "Softmax temperature; 0 = greedy."),
    SamplingField("top_p", float, 1.0, "Nucleus sampling mass; 1 = off."),
    SamplingField("top_k", int, 0, "Keep the k most likely tokens; 0 = off (OpenAI surfaces: -1 too)."),
    SamplingField("min_p", float, 0.0, "Drop tokens below min_p x the top token's probability; 0 = off."),
    SamplingField("repetition_penalty", float, 1.0, "CTRL-style penalty on prompt and output tokens; 1 = off."),
    SamplingField("frequency_penalty", float, 0.0, "Subtracted per previous occurrence in the output."),
    SamplingField("presence_penalty", float, 0.0, "Subtracted once if the token occurred in the output."),
    SamplingField("seed", int, None, "Same seed and input, same tokens; unset = random."),
    SamplingField("max_tokens", int, None, "Most tokens to generate; unset = what fits (server-capped)."),
    SamplingField("stop", str, (), "Stop strings, matched on the decoded text; not part of the output.",
                  repeated=True, engine=False),
    SamplingField("stop_token_ids", int, (), "Token ids that end the output (besides EOS).", repeated=True),
    SamplingField("ignore_eos", bool, False, "Keep generating past EOS (benchmarks)."),
    SamplingField("logprobs", int, None, "Alternatives reported with each token's logprob; unset = none."),
    SamplingField("include_stop", bool, False, "Keep the matched stop string in the output.",
                  contract="include_stop_str_in_output", engine=False),
    SamplingField("n", int, 1, "Independent completions of one request.", engine=False),
    SamplingField("speculative", bool, None, "Speculative decoding: unset = the server's policy, false = never, "
                  "true = also in large batches (outputs are the same either way)."),
)
FIELDS: dict[str, SamplingField] = {row.name: row for row in _ROWS}
ENGINE_FIELDS: tuple[SamplingField, ...] = tuple(row for row in _ROWS if row.engine)
