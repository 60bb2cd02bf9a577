"""The Triton draw against the torch reference: bit-identical uniforms, equal tokens, invariance."""

from __future__ import annotations

import pytest
import torch

from kernels.reference.counter_hash import row_keys, uniforms
from kernels.reference.sampling import sample_ref
from kernels.sampling import counter_uniforms

SEEDS = [0, 1, -1, 2**62, -(2**63), 12345, 2**63 - 1]
OFFSETS = [0, 0, 7, 2**40, 3, -5, 2**63 - 1]


def _params(n: int, device, **overrides) -> dict:
    params = {
        "temperature": torch.tensor([0.0, 1.0, 0.7, 1.0, 2.0, 0.5, 1.3][:n]),
        "top_k": torch.tensor([0, 0, 5, 50, 0, 1, 0][:n]),
        "top_p": torch.tensor([1.0, 1.0, 0.9, 0.5, 1.0, 1.0, 0.8][:n]),
        "min_p": torch.tensor([0.0, 0.0, 0.0, 0.1, 0.2, 0.0, 0.05][:n]),
        "seeds": torch.tensor(SEEDS[:n]),
        "offsets": torch.tensor(OFFSETS[:n]),
    } | overrides
    return {k: v.to(device) for k, v in params.items()}


@pytest.mark.parametrize("vocab", [1, 17, 3001])
def test_uniforms_are_bit_identical_to_torch(triton_ops, vocab):
    seeds, offsets = torch.tensor(SEEDS, device=triton_ops.device), torch.tensor(OFFSETS, device=triton_ops.device)
    got = counter_uniforms(seeds, offsets, vocab)
    want = uniforms(row_keys(seeds, offsets), vocab)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("vocab", [2, 1031, 3001])
def test_tokens_match_reference(triton_ops, vocab):
    # Mixed rows: greedy, plain temperature, top-k, top-p, min-p and combinations (see _params).
    logits = (torch.randn(7, vocab) * 3).to(triton_ops.device)
    params = _params(7, triton_ops.device)
    torch.testing.assert_close(triton_ops.sample(logits, **params), sample_ref(logits, **params), atol=0, rtol=0)


def test_greedy_ties_resolve_to_the_lowest_index_across_chunks(triton_ops):
    # 1030 sits in lane 6 of the second 1024-wide chunk, 7 in lane 7 of the first: lanes alone
    # would pick 1030, the kernel must answer 7 like torch.argmax.
    logits = torch.zeros(2, 2500)
    logits[0, [1030, 7, 2400]] = 5.0
    logits[1, :] = 1.0
    params = _params(2, triton_ops.device, temperature=torch.zeros(2))
    assert triton_ops.sample(logits.to(triton_ops.device), **params).tolist() == [7, 0]


def test_a_rows_token_ignores_its_batch_mates_and_repeats_with_its_seed(triton_ops):
    dev = triton_ops.device
    logits = torch.randn(7, 4099, device=dev)
    params = _params(7, dev)
    full = triton_ops.sample(logits, **params)
    torch.testing.assert_close(triton_ops.sample(logits, **params), full, atol=0, rtol=0)
    for row in (1, 4):
        alone = triton_ops.sample(logits[row : row + 1], **{k: v[row : row + 1] for k, v in params.items()})
        assert alone.item() == full[row].item()
