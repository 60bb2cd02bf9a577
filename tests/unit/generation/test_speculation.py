"""Speculative decoding by prompt lookup (speculation.py) is exact: greedy tokens and their
logprobs are those of decoding one token a step, alone and batched, with max_tokens, stop tokens and
prompts that repeat; the KV of rejected proposals never leaks into the prefix cache or the pool.
Sampled, penalised and grammar-constrained requests get the tokens they get without speculation,
seed for seed (test_speculation_sampled.py)."""

from __future__ import annotations

import dataclasses

import pytest
from generation_helpers import drive, make_engine

from services.generation.sampling_params import SamplingParams
from services.generation.speculation import SpeculationConfig, propose_ngram
from services.generation.weights.random_init import TINY, random_checkpoint

REPEAT = [7, 8, 9, 10, 11] * 6  # a passage the model may copy
PROMPTS = [REPEAT, [5, 6, 7, 8, 5, 6, 7], list(range(20, 57)), [42], [3, 4] * 10 + [9]]


def test_propose_ngram_takes_what_followed_the_latest_longest_match():
    assert propose_ngram([1, 2, 3, 4, 1, 2, 3], 2, 3, 1) == (4, 1)
    assert propose_ngram([1, 2, 3, 9, 2, 3, 5, 2, 3], 3, 3, 1) == (5, 2, 3)  # latest "2 3"
    assert propose_ngram([1, 2, 3, 4, 5], 3, 3, 1) == ()  # "5" never seen before
    assert propose_ngram([4, 4], 3, 3, 1) == (4,)
    assert propose_ngram([7], 3, 3, 1) == ()


@pytest.fixture(scope="module")
def checkpoint():
    return random_checkpoint(dataclasses.replace(TINY, vocab_size=64), seed=5)  # small: outputs repeat


def run(checkpoint, prompts, params, mode, **engine_kw):
    engine = make_engine(checkpoint, dtype="float32", quantization="none",
                         speculation=SpeculationConfig(mode, num_tokens=4, max_rows=8), **engine_kw)
    for i, p in enumerate(prompts):
        engine.add_request(i, p, params)
    tokens, completed, failed, steps = drive(engine)
    assert not failed
    logprobs = {}
    for out in steps:
        for t in out.tokens:
            logprobs.setdefault(t.key, []).append(t.logprobs)
    return engine, tokens, completed, logprobs, len(steps)


@pytest.mark.parametrize("batch", [1, len(PROMPTS)])
@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True, logprobs=3),
    SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=(9, 11)),
], ids=["plain", "logprobs", "stop-tokens"])
def test_greedy_with_speculation_is_greedy_without(checkpoint, params, batch):
    groups = [PROMPTS[i:i + batch] for i in range(0, len(PROMPTS), batch)]
    for prompts in groups:
        _, want, want_done, want_lp, plain_steps = run(checkpoint, prompts, params, "off")
        engine, got, got_done, got_lp, spec_steps = run(checkpoint, prompts, params, "ngram")
        assert got == want
        assert {k: c.finish_reason for k, c in got_done.items()} == {k: c.finish_reason for k, c in want_done.items()}
        for key in want_lp:
            for a, b in zip(got_lp[key], want_lp[key], strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    assert a.top_token_ids == b.top_token_ids
                    assert a.top_logprobs == pytest.approx(b.top_logprobs, abs=1e-5)
        bm = engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)


def test_a_copying_request_verifies_several_tokens_a_step(checkpoint):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    _, want, _, _, plain_steps = run(checkpoint, [REPEAT], params, "off")
    engine, got, _, _, spec_steps = run(checkpoint, [REPEAT], params, "ngram")
    assert got == want
    stats = engine.stats
    assert stats.num_spec_proposed > 0 and stats.num_spec_accepted > 0
    assert spec_steps < plain_steps  # accepted proposals saved steps
    assert plain_steps - spec_steps <= stats.num_spec_accepted


def test_the_prefix_cache_only_holds_final_tokens(checkpoint):
    """A second request with the first one's prompt + output hits only blocks whose K/V matches:
    its continuation equals a fresh engine's."""
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    engine = make_engine(checkpoint, dtype="float32", quantization="none",
                         speculation=SpeculationConfig("ngram", num_tokens=4, max_rows=8))
    engine.add_request(0, REPEAT, params)
    first, _, _, _ = drive(engine)
    follow = REPEAT + first[0]
    engine.add_request(1, follow, params)
    again, completed, _, _ = drive(engine)
    assert completed[1].num_cached_tokens > len(REPEAT)
    fresh = make_engine(checkpoint, dtype="float32", quantization="none", speculation=SpeculationConfig("off"))
    fresh.add_request(1, follow, params)
    expected, _, _, _ = drive(fresh)
    assert again[1] == expected[1]


def test_no_speculation_past_max_rows_unless_a_request_asks(checkpoint):
    """Above max_rows decoding sequences nobody speculates, except a request with speculative=True;
    speculative=False turns it off for that request alone."""
    def proposed(params_of):
        engine = make_engine(checkpoint, dtype="float32", quantization="none",
                             speculation=SpeculationConfig("ngram", num_tokens=4, max_rows=2))
        for i in range(3):
            engine.add_request(i, REPEAT, params_of(i))
        tokens, _, failed, _ = drive(engine)
        assert not failed
        return engine.stats.num_spec_proposed, tokens

    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    crowded, want = proposed(lambda i: greedy)
    assert crowded == 0
    asked, got = proposed(lambda i: dataclasses.replace(greedy, speculative=True) if i == 0 else greedy)
    assert asked > 0 and got == want
    engine = make_engine(checkpoint, dtype="float32", quantization="none",
                         speculation=SpeculationConfig("ngram", num_tokens=4, max_rows=8))
    engine.add_request(0, REPEAT, dataclasses.replace(greedy, speculative=False))
    drive(engine)
    assert engine.stats.num_spec_proposed == 0


def test_auto_speculates_only_where_verify_rows_are_exact(checkpoint, quantized):
    for step in ("eager", "fused"):  # block codes through the CPU kernels: exact
        codes = make_engine(quantized, kernels="cpu", step=step)
        assert codes.runner.verify_rows_exact and codes._step.speculator.active
    dense = make_engine(checkpoint, kernels="cpu", step="eager")  # F.linear: 1e-6 apart by row count
    assert not dense.runner.verify_rows_exact and not dense._step.speculator.active
    graph = make_engine(checkpoint, kernels="cpu", dtype="bfloat16", quantization="none", step="graph")
    assert not graph.runner.verify_rows_exact and not graph._step.speculator.active
    forced = make_engine(checkpoint, kernels="cpu", dtype="bfloat16", quantization="none", step="graph",
                         speculation=SpeculationConfig("ngram"))
    assert forced._step.speculator.active
    off = make_engine(checkpoint, kernels="cpu", speculation=SpeculationConfig("off"))
    assert not off._step.speculator.active


def test_the_proposal_length_follows_acceptance():
    from services.generation.sequence import Sequence, Timing
    from services.generation.speculation import Speculator

    seq = Sequence(0, 0, [1, 2, 3], SamplingParams(), 0, Timing(0.0, 0.0))
    Speculator.adapt(seq, 4, 0, 6)
    assert seq.spec_tokens == 2
    Speculator.adapt(seq, 2, 0, 6)
    Speculator.adapt(seq, 1, 0, 6)
    assert seq.spec_tokens == 1  # never below one
    Speculator.adapt(seq, 1, 1, 6)
    Speculator.adapt(seq, 2, 2, 6)
    assert seq.spec_tokens == 3
    Speculator.adapt(seq, 3, 1, 6)  # partly: unchanged
    assert seq.spec_tokens == 3
    for _ in range(5):
        Speculator.adapt(seq, seq.spec_tokens, seq.spec_tokens, 6)
    assert seq.spec_tokens == 6


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    from services.generation.weights.gguf import load_gguf
    from services.generation.weights.random_init import save_gguf

    checkpoint = random_checkpoint(dataclasses.replace(TINY, vocab_size=64), seed=5, std=0.3)
    return load_gguf(save_gguf(checkpoint, str(tmp_path_factory.mktemp("gguf") / "tiny-Q4_1.gguf"), "Q4_1",
                               head_type="Q8_0"))  # as the default model: every matmul on block codes


@pytest.mark.parametrize("step", ["fused", "eager"])
def test_verify_rows_carry_decode_rows_bits_on_the_cpu_kernels(quantized, step):
    """What `make run` serves (a GGUF's codes through the CPU kernels): every verify row's logprobs
    equal, bit for bit, those of decoding the same token alone, so near-ties break the same way."""
    from services.generation.engine import Engine, EngineConfig
    from services.generation.model_runner import ModelRunner, RunnerConfig

    runner = ModelRunner(quantized, RunnerConfig(64, 4, "cpu", num_threads=1, step=step))
    runner.warm_up()
    assert runner.verify_rows_exact
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=5)
    results = {}
    for mode in ("off", "ngram"):
        engine = Engine(runner, EngineConfig(64, 4, 8, 64, speculation=SpeculationConfig(mode, max_rows=8)),
                        on_step=lambda out: None)
        for i, p in enumerate(PROMPTS[:3]):
            engine.add_request(i, p, params)
        _, _, failed, steps = drive(engine)
        assert not failed
        results[mode] = {(t.key, t.index): (t.token_id, t.logprobs.top_token_ids, t.logprobs.top_logprobs)
                         for out in steps for t in out.tokens}
        if mode == "ngram":
            assert engine.stats.num_spec_proposed > 0
    assert results["ngram"] == results["off"]


def test_a_sequence_whose_proposals_rarely_hold_only_probes():
    """Below min_acceptance (moving average) a sequence proposes one token every probe_every steps;
    a probe that holds brings it back to every step."""
    from services.generation.sequence import Sequence, Timing
    from services.generation.speculation import Speculator

    speculator = Speculator(SpeculationConfig("ngram", num_tokens=4, min_acceptance=0.25, probe_every=4), 1000, True)
    seq = Sequence(0, 0, [1, 2, 3, 4, 5, 6, 7, 8, 1, 2], SamplingParams(temperature=0.7), 0, Timing(0.0, 0.0),
                   max_tokens=100)
    seq.append_output(3)
    seq.num_computed_tokens = len(seq) - 1

    def step(accepted: int) -> int:
        speculator.propose([seq])
        proposed = len(seq.proposal)
        if proposed:
            Speculator.adapt(seq, proposed, min(accepted, proposed), 4)
        return proposed

    assert [step(0) for _ in range(6)] == [4, 2, 1, 1, 1, 0]  # the share: 0.75, 0.56, 0.42, 0.32, 0.24
    assert [step(0) for _ in range(8)] == [0, 0, 1, 0, 0, 0, 1, 0]  # a probe every 4th step
    assert [step(1) for _ in range(5)] == [0, 0, 1, 2, 2]  # a probe held: every step again, and longer
