"""bench/faithfulness.py's figures: KL(oracle || variant) is 0 for the oracle itself and grows with
the distance, top-1 agreement counts arg-max matches, and the windows are real, distinct text."""

from __future__ import annotations

import torch

from bench.faithfulness import compare, render


def test_kl_and_top1_against_the_oracle():
    g = torch.Generator().manual_seed(0)
    oracle_logits = torch.randn(5, 32, generator=g)
    oracle = [torch.log_softmax(oracle_logits, dim=-1)]
    same = compare(oracle, [oracle_logits.clone()])
    assert same["kl_max"] < 1e-6 and same["top1_agreement"] == 1.0 and same["positions"] == 5
    near = compare(oracle, [oracle_logits + 0.01 * torch.randn(5, 32, generator=g)])
    far = compare(oracle, [oracle_logits + 1.0 * torch.randn(5, 32, generator=g)])
    assert 0 < near["kl_mean"] < far["kl_mean"]
    flipped = oracle_logits.clone()
    flipped[0] = -flipped[0]  # position 0's arg-max moves
    assert compare(oracle, [flipped])["top1_agreement"] == 4 / 5


def test_the_table_shows_each_variant():
    row = {"kl_mean": 0.0034, "kl_p99": 0.015, "kl_max": 0.05, "top1_agreement": 0.9595, "greedy_identical": 2,
           "greedy_mean_prefix": 29.5, "seconds": 12.0, "numerics": {"weights": "Q4_1 codes", "kv_cache": "bfloat16"}}
    text = render({"windows": 12, "window_tokens": 256, "python": "3.11.7", "greedy_prompts": 8, "new_tokens": 64,
                   "variants": {"default": row}})
    assert "| default | Q4_1 codes / bfloat16 | 0.00340 | 0.0150 | 0.050 | 95.95 % | 2/8 | 29.5 | 12.0 |" in text
