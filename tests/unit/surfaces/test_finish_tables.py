"""One domain FinishReason end to end; every surface maps every value (a new reason fails here
until each surface says what it means in its own vocabulary), and the wire enum round-trips it."""

from __future__ import annotations

import pytest
from mstar.v1 import messages_pb2 as pb

from services.common.finish import FinishReason
from services.common.finish_wire import WIRE, finish_reason_of
from services.preprocess.surfaces.anthropic.render import STOP_REASONS
from services.preprocess.surfaces.openai.render import FINISH_REASONS
from services.preprocess.surfaces.responses.render import STATUS


@pytest.mark.parametrize("table", [FINISH_REASONS, STOP_REASONS, STATUS], ids=["openai", "anthropic", "responses"])
def test_every_surface_maps_every_reason(table):
    assert set(table) == set(FinishReason)


@pytest.mark.parametrize("reason", list(FinishReason))
def test_the_wire_round_trips_every_reason(reason):
    stop = "###" if reason is FinishReason.STOP_STRING else ""
    assert finish_reason_of(WIRE[reason], stop) is reason


def test_every_wire_value_is_read_and_error_is_gone():
    """FINISH_REASON_ERROR was declared and never produced: a failed request ends with
    RequestFailed. It is reserved now (protos/breaking_allowed.txt says why)."""
    names = set(pb.FinishReason.keys()) - {"FINISH_REASON_UNSPECIFIED"}
    assert names == {"FINISH_REASON_STOP", "FINISH_REASON_LENGTH", "FINISH_REASON_CANCELLED"}
    assert {pb.FinishReason.Name(v) for v in WIRE.values()} == names
    assert finish_reason_of(pb.FINISH_REASON_UNSPECIFIED) is FinishReason.END


def test_metrics_keep_their_coarse_labels():
    assert [r.label for r in FinishReason] == ["stop", "stop", "length", "cancelled"]


def test_the_surfaces_vocabularies():
    assert [FINISH_REASONS[r] for r in FinishReason] == ["stop", "stop", "length", "stop"]
    assert [STOP_REASONS[r] for r in FinishReason] == ["end_turn", "stop_sequence", "max_tokens", None]
    assert [STATUS[r] for r in FinishReason] == ["completed", "completed", "incomplete", "cancelled"]
