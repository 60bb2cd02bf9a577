"""mstar.v1.FinishReason <-> the domain FinishReason (services/common/finish.py).

Every wire module uses this one table: the generation service writes the engine's reason onto
RequestComplete, preprocess reads it back and writes the public RequestComplete. The wire enum
has one STOP for END and STOP_STRING (`stop_reason` tells them apart), and FINISH_REASON_ERROR
is gone (a failed request ends with RequestFailed). Protobuf stops here.
"""

from __future__ import annotations

from mstar.v1 import messages_pb2 as pb

from services.common.finish import FinishReason

WIRE = {
    FinishReason.END: pb.FINISH_REASON_STOP,
    FinishReason.STOP_STRING: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
}
_FROM_WIRE = {
    pb.FINISH_REASON_STOP: FinishReason.END,
    pb.FINISH_REASON_LENGTH: FinishReason.LENGTH,
    pb.FINISH_REASON_CANCELLED: FinishReason.CANCELLED,
}


def finish_reason_of(value: int, stop_reason: str = "") -> FinishReason:
    """The domain reason of a RequestComplete's `finish_reason` (UNSPECIFIED reads as END)."""
    reason = _FROM_WIRE.get(value, FinishReason.END)
    return FinishReason.STOP_STRING if reason is FinishReason.END and stop_reason else reason
