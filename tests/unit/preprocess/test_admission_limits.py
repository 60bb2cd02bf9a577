"""Admission bounds and request caps (no server)."""

from __future__ import annotations

import pytest

from services.common.errors import Code, MstarError
from services.preprocess.admission import Admission, AdmissionLimits
from services.preprocess.limits import Limits, effective_max_tokens, validate_sampling
from services.preprocess.request import Sampling


def test_admission_by_requests_and_tokens():
    adm = Admission(AdmissionLimits(max_requests=2, max_prompt_tokens=100))
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


def _refused(adm, *args, **kw) -> MstarError:
    with pytest.raises(MstarError) as info:
        adm.admit(*args, **kw)
    assert info.value.code == Code.RESOURCE_EXHAUSTED and info.value.retry_after_s > 0
    return info.value


def test_one_client_cannot_take_every_slot():
    adm = Admission(AdmissionLimits(max_requests=8, max_requests_per_client=3))
    greedy = [adm.admit(1, "addr:a") for _ in range(3)]
    err = _refused(adm, 1, "addr:a")
    assert err.reason == "CLIENT_LIMIT" and "addr:a" not in err.message  # the identity is not echoed
    others = [adm.admit(1, f"addr:{c}") for c in "bcdef"]  # everyone else still gets in
    assert _refused(adm, 1, "addr:g").reason == "OVERLOADED"  # the global bound still holds
    greedy[0].release()
    greedy[0].release()
    assert adm.snapshot() == {"clients": 6, "busiest_client_requests": 2, "open_inputs": 0, "requests": 7}
    adm.admit(1, "addr:a")
    for t in greedy[1:] + others:
        t.release()
    assert adm.snapshot()["clients"] == 1


def test_shares_default_to_fractions_of_the_slots():
    assert AdmissionLimits.sized(64) == AdmissionLimits(64, 256 * 1024, 48, 32, 16)
    small = AdmissionLimits.sized(2, 100, max_open_inputs=5)
    assert (small.max_requests_per_client, small.max_open_inputs, small.max_open_inputs_per_client) == (2, 5, 1)


def test_open_inputs_have_their_own_per_client_and_global_bounds():
    adm = Admission(AdmissionLimits(max_requests=64, max_requests_per_client=64, max_open_inputs=5,
                                    max_open_inputs_per_client=2))
    squatter = [adm.admit(1, "key:client-0", input_open=True) for _ in range(2)]
    assert _refused(adm, 1, "key:client-0", input_open=True).reason == "OPEN_INPUT_LIMIT"
    closed = adm.admit(1, "key:client-0")  # a one-shot request of the same client is fine
    squatter[0].close_input()  # its input ended: the open-input slot is free, the request runs on
    squatter.append(adm.admit(1, "key:client-0", input_open=True))
    more = [adm.admit(1, f"key:client-{i}", input_open=True) for i in (1, 1, 2)]
    assert _refused(adm, 1, "key:client-3", input_open=True).reason == "OPEN_INPUT_LIMIT"  # 5 open overall
    assert adm.snapshot()["open_inputs"] == 5
    for t in squatter + more + [closed]:
        t.release()
    assert adm.snapshot() == {"clients": 0, "busiest_client_requests": 0, "open_inputs": 0, "requests": 0}


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
