"""The sampling reference: greedy, hand-computed filter masks, seeds and batch invariance."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.reference.counter_hash import row_keys, uniforms
from kernels.reference.sampling import apply_sampling_filters, sample_ref

PROBS = [0.5, 0.3, 0.15, 0.05]


def _rows(n: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, offset=0) -> dict:
    return {
        "temperature": torch.full((n,), temperature),
        "top_k": torch.full((n,), top_k, dtype=torch.int64),
        "top_p": torch.full((n,), top_p),
        "min_p": torch.full((n,), min_p),
        "seeds": torch.full((n,), seed, dtype=torch.int64),
        "offsets": torch.full((n,), offset, dtype=torch.int64),
    }


def _kept(logits: torch.Tensor, **params) -> list[int]:
    p = _rows(1, **params)
    out = apply_sampling_filters(logits[None], p["temperature"], p["top_k"], p["top_p"], p["min_p"])
    return torch.isfinite(out[0]).nonzero().squeeze(1).tolist()


def test_temperature_zero_is_argmax_and_ignores_filters():
    logits = torch.randn(6, 1031)
    params = _rows(6, temperature=0.0, top_k=3, top_p=0.1, min_p=0.9, seed=7)
    torch.testing.assert_close(sample_ref(logits, **params), logits.argmax(-1))


def test_greedy_ties_take_the_first_index():
    logits = torch.zeros(1, 10)
    logits[0, [3, 8]] = 1.0
    assert sample_ref(logits, **_rows(1, temperature=0.0)).item() == 3


@pytest.mark.parametrize(
    ("params", "kept"),
    [
        ({"top_k": 2}, [0, 1]),
        ({"top_k": 1}, [0]),
        ({"top_p": 0.4}, [0]),  # mass before token 1 is 0.5 >= 0.4
        ({"top_p": 0.75}, [0, 1]),  # 0.5 < 0.75, then 0.8 >= 0.75
        ({"top_p": 0.85}, [0, 1, 2]),
        ({"min_p": 0.25}, [0, 1, 2]),  # keep prob >= 0.125
        ({"min_p": 0.5}, [0, 1]),  # keep prob >= 0.25
        ({"top_k": 2, "top_p": 0.6}, [0]),  # top-p on the renormalised top-2: [0.625, 0.375]
        ({"top_k": 2, "top_p": 0.7}, [0, 1]),
        ({"top_k": 3, "min_p": 0.5}, [0, 1]),
        ({"top_k": 0, "top_p": 1.0, "min_p": 0.0}, [0, 1, 2, 3]),
    ],
)
def test_filters_match_hand_computed_sets(params, kept):
    logits = torch.tensor(PROBS).log()
    assert _kept(logits, **params) == kept


def test_top_k_keeps_ties_at_the_threshold():
    assert _kept(torch.tensor([1.0, 2.0, 2.0, 0.0]), top_k=1) == [1, 2]


def test_top_p_uses_temperature_scaled_probabilities():
    logits = torch.tensor(PROBS).log()
    # temperature 0.5 squares and renormalises: [0.69, 0.25, 0.06, 0.007] -> 0.69 alone reaches 0.6
    assert _kept(logits, temperature=0.5, top_p=0.6) == [0]
    assert _kept(logits, temperature=1.0, top_p=0.6) == [0, 1]


def test_draws_stay_in_the_kept_set_and_follow_its_distribution():
    n = 4000
    logits = torch.tensor(PROBS).log().expand(n, 4).contiguous()
    params = _rows(n, top_k=3, seed=42)
    params["offsets"] = torch.arange(n)
    tokens = sample_ref(logits, **params)
    counts = torch.bincount(tokens, minlength=4).double() / n
    assert counts[3] == 0
    expected = torch.tensor([0.5, 0.3, 0.15, 0.0], dtype=torch.float64) / 0.95
    # 4000 draws: binomial std <= 0.008, so 0.04 is a 5-sigma bound (deterministic with the seed).
    torch.testing.assert_close(counts, expected, atol=0.04, rtol=0)


def test_same_seed_and_offset_reproduce_and_batch_mates_do_not_matter():
    logits = torch.randn(5, 2003)
    params = _rows(5, temperature=0.8, top_p=0.95, seed=3)
    params["seeds"] = torch.tensor([3, 3, -9, 2**62, 0])
    first = sample_ref(logits, **params)
    torch.testing.assert_close(sample_ref(logits, **params), first)
    # Row 2 alone, and row 2 next to different rows, draws the same token.
    alone = {k: v[2:3] for k, v in params.items()}
    assert sample_ref(logits[2:3], **alone).item() == first[2].item()
    mates = {k: torch.cat([v[2:3], v[:2]]) for k, v in params.items()}
    mates["seeds"] = torch.tensor([-9, 11, 12])
    assert sample_ref(torch.cat([logits[2:3], torch.randn(2, 2003)]), **mates)[0].item() == first[2].item()


def test_offsets_change_the_draw():
    logits = torch.zeros(64, 1000)  # uniform distribution
    params = _rows(64, seed=5)
    params["offsets"] = torch.arange(64)
    assert len(set(sample_ref(logits, **params).tolist())) > 55  # ~62 distinct expected


def test_uniforms_are_in_the_open_unit_interval_and_well_spread():
    u = uniforms(row_keys(torch.tensor([0, -1, 2**63 - 1]), torch.tensor([0, 2**40, 7])), 50000)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert abs(float(u.var()) - 1 / 12) < 0.005
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[1], u[2])
    assert math.isfinite(float((-torch.log(-torch.log(u))).max()))
