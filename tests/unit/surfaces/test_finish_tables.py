"""One domain FinishReason; every surface maps every value (a new reason fails here until each
surface says what it means in its own vocabulary)."""

from __future__ import annotations

import pytest

from services.preprocess.finish import FinishReason, finish_of
from services.preprocess.surfaces.anthropic.render import STOP_REASONS
from services.preprocess.surfaces.openai.render import FINISH_REASONS
from services.preprocess.surfaces.responses.render import STATUS


@pytest.mark.parametrize("table", [FINISH_REASONS, STOP_REASONS, STATUS], ids=["openai", "anthropic", "responses"])
def test_every_surface_maps_every_reason(table):
    assert set(table) == set(FinishReason)


@pytest.mark.parametrize(("finish", "stop", "reason"), [
    ("stop", "", FinishReason.END), ("stop", "###", FinishReason.STOP_STRING),
    ("length", "", FinishReason.LENGTH), ("cancelled", "", FinishReason.CANCELLED)])
def test_domain_reason_of_a_complete(finish, stop, reason):
    assert finish_of(finish, stop) is reason


def test_the_surfaces_vocabularies():
    assert [FINISH_REASONS[r] for r in FinishReason] == ["stop", "stop", "length", "stop"]
    assert [STOP_REASONS[r] for r in FinishReason] == ["end_turn", "stop_sequence", "max_tokens", None]
    assert [STATUS[r] for r in FinishReason] == ["completed", "completed", "incomplete", "cancelled"]
