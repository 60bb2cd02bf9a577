"""Speculation by a draft model (draft.py): greedy, sampled and constrained requests get the tokens
they get without speculation whatever the draft proposes (the target itself, which proposes what it
then accepts; or an unrelated model, whose proposals mostly fail); the draft's own KV pool is freed
when requests end; a long prompt catches up over several steps; a full draft pool only costs
proposals; a draft with another tokenizer is refused at start-up."""

from __future__ import annotations

import dataclasses

import pytest
from generation_helpers import codes_checkpoint, drive, make_engine

from services.common.structured_output import StructuredOutput
from services.generation.block_manager import BlockManager
from services.generation.draft import DraftModelError
from services.generation.sampling_params import SamplingParams
from services.generation.speculation import SpeculationConfig
from services.generation.weights.random_init import TINY

REPEAT = [7, 8, 9, 10, 11] * 6
PROMPTS = [REPEAT, [5, 6, 7, 8, 5, 6, 7] * 3, [3, 4] * 10 + [9], list(range(20, 40)) * 2, [42]]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return codes_checkpoint(tmp_path_factory, 64, 5)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    return codes_checkpoint(tmp_path_factory, 64, 9, num_layers=1)  # a smaller, unrelated draft


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return codes_checkpoint(tmp_path_factory, TINY.vocab_size, 0)  # the synthetic vocabulary spells JSON


def engine_for(checkpoint, draft=None, **kw):
    mode = "off" if draft is None else "draft"
    return make_engine(checkpoint, kernels="cpu", step="eager", max_num_seqs=64, num_blocks=128,
                       speculation=SpeculationConfig(mode, num_tokens=4, max_rows=8), draft_checkpoint=draft, **kw)


def outputs(engine, requests: dict, idle_wait_s: float = 0.0):
    for key, (prompt, params) in requests.items():
        engine.add_request(key, prompt, params)
    tokens, completed, failed, steps = drive(engine, idle_wait_s=idle_wait_s)
    assert not failed
    logprobs = {(t.key, t.index): (t.logprobs.top_token_ids, t.logprobs.top_logprobs)
                for out in steps for t in out.tokens if t.logprobs is not None}
    return tokens, {k: c.finish_reason for k, c in completed.items()}, logprobs, len(steps)


def _all_free(engine) -> bool:
    pools = [engine.block_manager, engine.speculator.draft.blocks]
    return all(bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks) for bm in pools)


PARAMS = {
    "greedy": dict(temperature=0.0),
    "logprobs": dict(temperature=0.0, logprobs=3),
    "seeded": dict(temperature=0.7),
    "top_k": dict(temperature=1.0, top_k=3),
    "penalties": dict(temperature=0.5, repetition_penalty=1.2, frequency_penalty=0.3),
}


@pytest.mark.parametrize("batch", [1, len(PROMPTS)])
@pytest.mark.parametrize("name", PARAMS)
def test_a_draft_model_leaves_every_token_as_it_was(target, other, name, batch):
    requests = {i: (p, SamplingParams(seed=100 + i, max_tokens=20, ignore_eos=True, **PARAMS[name]))
                for i, p in enumerate(PROMPTS[:batch])}
    want, want_done, want_lp, _ = outputs(engine_for(target), requests)
    for draft in (target, other):
        engine = engine_for(target, draft)
        got, got_done, got_lp, _ = outputs(engine, requests)
        assert got == want and got_done == want_done and got_lp == want_lp
        assert engine.stats.num_spec_proposed > 0
        assert _all_free(engine) and not engine.speculator.draft.shadows


def test_the_target_as_its_own_draft_is_accepted_and_saves_steps(target):
    requests = {0: (REPEAT, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))}
    want, _, _, plain_steps = outputs(engine_for(target), requests)
    engine = engine_for(target, target)
    got, _, _, spec_steps = outputs(engine, requests)
    assert got == want
    stats = engine.stats
    # The draft computes the target's rows with the target's arithmetic (prefill rows may differ
    # in the last bits from decode rows, so a near-tie may flip): nearly every proposal holds.
    assert stats.num_spec_accepted >= 0.9 * stats.num_spec_proposed > 0
    assert spec_steps < plain_steps / 2
    assert engine.stats.snapshot()["spec_draft_passes"] == engine.speculator.draft.num_passes > 0
    assert engine.speculator.proposer == "draft"


def test_a_long_prompt_catches_up_over_steps_and_a_full_pool_costs_only_proposals(target, other):
    prompt = list(range(1, 60))
    requests = {0: (prompt, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)),
                1: (REPEAT, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))}
    want, _, _, _ = outputs(engine_for(target), requests)
    engine = engine_for(target, target)
    engine.speculator.draft.max_catch_up = 8  # 59 prompt tokens: 8 steps before it proposes
    got, _, _, _ = outputs(engine, requests)
    assert got == want and engine.stats.num_spec_accepted > 0 and _all_free(engine)
    engine = engine_for(target, other)
    engine.speculator.draft.blocks = BlockManager(6, 4)  # 24 tokens: neither shadow fits for long
    got, _, _, _ = outputs(engine, requests)
    assert got == want and _all_free(engine)


def test_an_aborted_request_frees_its_draft_blocks(target):
    engine = engine_for(target, target)
    engine.add_request("a", REPEAT, SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    for _ in range(6):
        engine.run_once()
    assert engine.speculator.draft.shadows
    engine.abort("a")
    engine.run_once()
    assert not engine.seqs and _all_free(engine) and not engine.speculator.draft.shadows


def test_constrained_requests_keep_their_tokens_with_a_draft(tiny):
    so = StructuredOutput.from_regex(r"(ab|ba){4,12}c")
    requests = {seed: ([3 + seed, 40, 41, 40, 41], SamplingParams(
        temperature=(0.0, 0.8)[seed % 2], seed=seed, max_tokens=80, structured_output=so)) for seed in range(4)}
    want, want_done, _, _ = outputs(engine_for(tiny), requests, idle_wait_s=0.05)
    engine = engine_for(tiny, tiny)
    got, got_done, _, _ = outputs(engine, requests, idle_wait_s=0.05)
    assert got == want and got_done == want_done
    assert engine.stats.num_spec_accepted > 0


def test_a_draft_with_another_tokenizer_is_refused(target, tmp_path_factory):
    with pytest.raises(DraftModelError, match="tokenizer"):
        engine_for(target, codes_checkpoint(tmp_path_factory, 96, 1))
    respelled = dataclasses.replace(target, vocabulary=dataclasses.replace(
        target.vocabulary, tokens=tuple(reversed(target.vocabulary.tokens))))
    with pytest.raises(DraftModelError, match="spelled"):
        engine_for(target, respelled)
    with pytest.raises(ValueError, match="draft"):
        make_engine(target, speculation=SpeculationConfig("draft"))


def test_the_flags_go_together():
    from services.generation.__main__ import parse_args

    assert parse_args(["--draft-model", "d.gguf"]).speculative == "draft"  # auto with a draft: draft
    assert parse_args(["--draft-model", "d.gguf", "--speculative", "draft"]).speculative == "draft"
    for argv in (["--speculative", "draft"], ["--draft-model", "d.gguf", "--speculative", "ngram"],
                 ["--draft-model", "d.gguf", "--null-engine"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
