"""Why a request stopped generating: the one domain enum every surface maps from.

The generation service reports stop / length / cancelled; preprocess adds whether the stop was a
stop string (then `Complete.stop_reason` holds it). Each surface owns one table from this enum to
its own vocabulary (OpenAI `finish_reason`, Anthropic `stop_reason`, Responses `status`, the
native `FinishReason`), so a new reason is one row per surface, checked by
tests/unit/surfaces/test_finish_tables.py.
"""

from __future__ import annotations

import enum


class FinishReason(enum.Enum):
    END = "end"  # the model ended its turn: EOS or one of stop_token_ids
    STOP_STRING = "stop_string"  # a stop string matched (Complete.stop_reason is the string)
    LENGTH = "length"  # max_tokens (or the context) reached
    CANCELLED = "cancelled"  # cancelled by the client (Cancel RPC, Session cancel) or by a drain


def finish_of(finish_reason: str, stop_reason: str) -> FinishReason:
    """The domain reason of a Complete event (`finish_reason` "stop" | "length" | "cancelled")."""
    if finish_reason == "stop":
        return FinishReason.STOP_STRING if stop_reason else FinishReason.END
    return FinishReason(finish_reason)
