import math

import pytest
import torch

from kernels.dispatch import KernelOps
from services.generation.sampler import Sampler, apply_penalties
from services.generation.sampling_params import SamplingParams, validate_sampling_params
from services.generation.sequence import Sequence, Timing


def seq(params, tokens=(1, 2, 3), outputs=(), seed=0, seq_id=0):
    s = Sequence(seq_id, seq_id, list(tokens), params, seed, Timing(0.0, 0.0))
    for t in outputs:
        s.append_output(t)
    return s


@pytest.fixture(scope="module")
def sampler():
    return Sampler(KernelOps.create("cpu"), torch.device("cpu"))


# probabilities 0.4, 0.3, 0.2, 0.1 then tokens that are (practically) impossible
PROBS = torch.tensor([0.4, 0.3, 0.2, 0.1])
LOGITS = torch.cat([PROBS.log(), torch.full((4,), -30.0)])


def support(sampler, params, draws=300):
    seqs = [seq(params, seed=s, seq_id=s) for s in range(draws)]
    out = sampler(LOGITS.repeat(draws, 1), seqs)
    return set(out.token_ids)


@pytest.mark.parametrize(
    "params, allowed",
    [
        (SamplingParams(temperature=1.0), {0, 1, 2, 3}),
        (SamplingParams(temperature=1.0, top_k=2), {0, 1}),
        (SamplingParams(temperature=1.0, top_k=1), {0}),
        # top-p: cumulative 0.4, 0.7, 0.9: p=0.65 needs tokens 0,1; p=0.75 needs 0,1,2
        (SamplingParams(temperature=1.0, top_p=0.65), {0, 1}),
        (SamplingParams(temperature=1.0, top_p=0.75), {0, 1, 2}),
        # min-p: keep prob >= m * 0.4: m=0.6 -> >= 0.24 -> {0, 1}; m=0.45 -> >= 0.18 -> {0, 1, 2}
        (SamplingParams(temperature=1.0, min_p=0.6), {0, 1}),
        (SamplingParams(temperature=1.0, min_p=0.45), {0, 1, 2}),
        (SamplingParams(temperature=0.0, top_k=3), {0}),
    ],
)
def test_masks_match_hand_computed_support(sampler, params, allowed):
    assert support(sampler, params) == allowed


def test_seeded_draws_are_reproducible_and_batch_invariant(sampler):
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.9, top_p=0.95)
    alone = [sampler(logits[i : i + 1], [seq(params, seed=100 + i)]).token_ids[0] for i in range(6)]
    batch = sampler(logits, [seq(params, seed=100 + i, seq_id=i) for i in range(6)]).token_ids
    again = sampler(logits, [seq(params, seed=100 + i, seq_id=i) for i in range(6)]).token_ids
    assert alone == batch == again
    other = sampler(logits, [seq(params, seed=999 + i, seq_id=i) for i in range(6)]).token_ids
    assert other != batch


def test_penalties_hand_computed():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    s = seq(p, tokens=(0,), outputs=(1, 2, 2))  # prompt has 0; output has 1 once, 2 twice
    out = apply_penalties(logits, [s])[0].tolist()
    assert out == pytest.approx([2.0 / 2, -2.0 * 2 - 0.5 - 0.25, 1.0 / 2 - 1.0 - 0.25, 0.5])


def test_rows_without_penalties_are_untouched():
    logits = torch.randn(2, 8)
    s0 = seq(SamplingParams(), outputs=(1,))
    s1 = seq(SamplingParams(presence_penalty=1.0), outputs=(3,), seq_id=1)
    out = apply_penalties(logits, [s0, s1])
    assert torch.equal(out[0], logits[0]) and out[1, 3] == logits[1, 3] - 1.0


def test_logprobs_top_n(sampler):
    out = sampler(LOGITS[None], [seq(SamplingParams(temperature=0.0, logprobs=2))])
    lp = out.logprobs[0]
    assert out.token_ids == [0] and lp.top_token_ids == [0, 1]
    assert lp.logprob == pytest.approx(math.log(0.4), abs=1e-5)
    assert lp.top_logprobs[1] == pytest.approx(math.log(0.3), abs=1e-5)
    none = sampler(LOGITS[None], [seq(SamplingParams(temperature=0.0))])
    assert none.logprobs == [None]


def test_non_finite_rows_are_reported_alone(sampler):
    logits = torch.randn(3, 8)
    logits[1, 2] = float("nan")
    params = SamplingParams(temperature=0.0)
    out = sampler(logits, [seq(params, seq_id=i) for i in range(3)])
    assert out.is_finite == [True, False, True]
    assert out.token_ids[0] == int(logits[0].argmax()) and out.token_ids[2] == int(logits[2].argmax())


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_an_all_greedy_batch_draws_what_the_general_path_draws(backend, bad):
    # All-greedy batches take one op (KernelOps.greedy) instead of the general path; one row asking
    # for logprobs sends the same logits down the general path: tokens and finiteness must agree.
    sampler = Sampler(KernelOps.create("cpu", backend=backend), torch.device("cpu"))
    logits = torch.randn(4, 49152 + 5, generator=torch.Generator().manual_seed(2))
    logits[1, 7] = bad  # a broken row: reported, placeholder token 0
    logits[2, -1] = logits[2].max() + 1  # the max in the tail past the last full vector
    logits[3, 100] = logits[3, 4000] = logits[3].max() + 1  # a tie: the first index
    greedy = SamplingParams(temperature=0.0)
    fast = sampler(logits.clone(), [seq(greedy, seq_id=i) for i in range(4)])
    with_logprobs = [seq(SamplingParams(temperature=0.0, logprobs=1) if i == 0 else greedy, seq_id=i) for i in range(4)]
    general = sampler(logits.clone(), with_logprobs)
    assert fast.is_finite == general.is_finite == [True, False, True, True]
    assert fast.token_ids == general.token_ids == [int(logits[0].argmax()), 0, logits.shape[1] - 1, 100]
    assert fast.logprobs == [None] * 4


@pytest.mark.parametrize(
    "field, value",
    [("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
     ("min_p", 2.0), ("repetition_penalty", 0.0), ("max_tokens", 0), ("logprobs", 100), ("stop_token_ids", [10**6])],
)
def test_impossible_values_name_the_field(field, value):
    params = SamplingParams(**{field: value})
    message = validate_sampling_params(params, vocab_size=1000)
    assert message is not None and field in message
    assert validate_sampling_params(SamplingParams(), 1000) is None
