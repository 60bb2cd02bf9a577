"""Why a request stopped generating: the one enum both services and every surface use.

The engine ends a request with END (EOS or a stop token id), LENGTH or CANCELLED; preprocess
turns an END into STOP_STRING when one of the request's stop strings matched (then the Complete
event's `stop_reason` holds it). The wire enum `mstar.v1.FinishReason` appears only in the
servicers' wire modules (FINISH_REASON_STOP carries both END and STOP_STRING, told apart by
`stop_reason`). Each surface owns one table from this enum to its own vocabulary (OpenAI
`finish_reason`, Anthropic `stop_reason`, Responses `status`), so a new reason is one row per
surface, checked by tests/unit/surfaces/test_finish_tables.py.
"""

from __future__ import annotations

import enum


class FinishReason(enum.Enum):
    END = "end"  # the model ended its turn: EOS or one of stop_token_ids
    STOP_STRING = "stop_string"  # a stop string matched (Complete.stop_reason is the string)
    LENGTH = "length"  # max_tokens (or the context) reached
    CANCELLED = "cancelled"  # cancelled by the client (Cancel RPC, Session cancel) or by a drain

    @property
    def label(self) -> str:
        """The coarse word metrics and logs have always used: stop | length | cancelled."""
        return "stop" if self in (FinishReason.END, FinishReason.STOP_STRING) else self.value
