"""Admission bounds and request caps (no server)."""

from __future__ import annotations

import pytest

from services.common.errors import Code, MstarError
from services.preprocess.admission import Admission
from services.preprocess.limits import Limits, check_prompt_fits, effective_max_tokens, validate_sampling
from services.preprocess.request import Sampling


def test_admission_by_requests_and_tokens():
    adm = Admission(max_requests=2, max_prompt_tokens=100)
    a = adm.admit(60)
    with pytest.raises(MstarError) as info:
        adm.admit(50)  # tokens
    assert info.value.code == Code.RESOURCE_EXHAUSTED and info.value.retry_after_s > 0
    b = adm.admit(40)
    with pytest.raises(MstarError):
        adm.admit(1)  # requests
    a.release()
    a.release()  # idempotent
    b.add_tokens(10)
    assert (adm.requests_in_flight, adm.tokens_in_flight) == (1, 50)
    b.release()
    assert (adm.requests_in_flight, adm.tokens_in_flight) == (0, 0)
    adm.admit(10_000).release()  # alone, an oversized prompt is still admitted


def test_prompt_fits_boundary():
    check_prompt_fits(8191, 8192, "input.text")
    for n in (8192, 9000):
        with pytest.raises(MstarError) as info:
            check_prompt_fits(n, 8192, "input.text")
        assert info.value.reason == "PROMPT_TOO_LONG" and info.value.field_violations[0].field == "input.text"


def test_max_tokens_clamp_policy():
    limits = Limits(max_tokens_cap=4096)
    assert effective_max_tokens(None, 100, 8192, limits) == (4096, ())
    assert effective_max_tokens(50, 100, 8192, limits) == (50, ())
    assert effective_max_tokens(4000, 7000, 8192, limits) == (1192, ("max_tokens clamped to 1192",))


def test_operator_default_max_tokens_applies_only_when_the_request_sets_none():
    limits = Limits(max_tokens_cap=4096, default_max_tokens=256)
    assert effective_max_tokens(None, 100, 8192, limits) == (256, ())
    assert effective_max_tokens(1000, 100, 8192, limits) == (1000, ())  # an explicit value wins
    assert effective_max_tokens(None, 8000, 8192, limits) == (192, ())  # never more than fits


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=float("inf")),
        Sampling(top_p=0.0),
        Sampling(top_k=-1),
        Sampling(min_p=1.5),
        Sampling(max_tokens=-5),
        Sampling(stop=("",)),
        Sampling(stop_token_ids=(10**9,)),
    ],
)
def test_invalid_sampling(sampling):
    with pytest.raises(MstarError) as info:
        validate_sampling(sampling, Limits(), vocab_size=49152)
    assert info.value.code == Code.INVALID_ARGUMENT


def test_valid_sampling():
    validate_sampling(Sampling(temperature=0, top_p=1, top_k=50, stop=("\n\n",), logprobs=5), Limits(), 49152)
