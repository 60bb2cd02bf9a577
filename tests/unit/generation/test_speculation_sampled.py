"""Speculation beyond greedy (speculation.py, sampler.py): a sampled, penalised or grammar-constrained
request gets, seed for seed, the tokens it gets without speculation, because each verify row is
drawn as decoding would draw that position; and the tokens keep the model's distribution (a
chi-square test on a small vocabulary, which a biased acceptance rule fails)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from generation_helpers import codes_checkpoint, drive, make_engine

from services.common.structured_output import StructuredOutput
from services.generation.postprocess import Postprocess
from services.generation.sampling_params import SamplingParams
from services.generation.speculation import SpeculationConfig
from services.generation.weights.random_init import TINY

REPEAT = [7, 8, 9, 10, 11] * 6


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return codes_checkpoint(tmp_path_factory, 64, 5)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return codes_checkpoint(tmp_path_factory, TINY.vocab_size, 0)  # the synthetic vocabulary spells JSON


def engine_for(checkpoint, mode: str, max_rows: int = 8, **kw):
    return make_engine(checkpoint, kernels="cpu", step="eager", max_num_seqs=64,
                       speculation=SpeculationConfig(mode, num_tokens=4, max_rows=max_rows), **kw)


def outputs(checkpoint, mode: str, requests: dict, max_rows: int = 8, idle_wait_s: float = 0.0):
    engine = engine_for(checkpoint, mode, max_rows)
    assert engine.runner.verify_rows_exact
    for key, (prompt, params) in requests.items():
        engine.add_request(key, prompt, params)
    tokens, completed, failed, steps = drive(engine, idle_wait_s=idle_wait_s)
    assert not failed
    logprobs = {(t.key, t.index): (t.logprobs.top_token_ids, t.logprobs.top_logprobs)
                for out in steps for t in out.tokens if t.logprobs is not None}
    return tokens, {k: c.finish_reason for k, c in completed.items()}, logprobs, engine.stats


SAMPLED = {
    "seeded": dict(temperature=0.6),
    "top_k": dict(temperature=1.0, top_k=3),
    "top_p": dict(temperature=0.9, top_p=0.6),
    "min_p": dict(temperature=1.0, min_p=0.3),
    "penalties": dict(temperature=0.5, repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.2),
    "logprobs": dict(temperature=0.6, logprobs=3),
}


@pytest.mark.parametrize("batch", [1, 4])
def test_sampled_requests_draw_the_same_tokens_with_speculation(small, batch):
    prompts = [REPEAT, [5, 6, 7, 8, 5, 6, 7] * 3, [3, 4] * 10 + [9], list(range(20, 40)) * 2]
    proposed = accepted = 0
    for name, kw in SAMPLED.items():
        for start in range(0, len(prompts), batch):
            requests = {(name, i): (p, SamplingParams(seed=100 + i, max_tokens=24, ignore_eos=True, **kw))
                        for i, p in enumerate(prompts[start:start + batch], start)}
            want, want_done, want_lp, _ = outputs(small, "off", requests)
            got, got_done, got_lp, stats = outputs(small, "ngram", requests)
            assert got == want, name
            assert got_done == want_done and got_lp == want_lp
            proposed += stats.num_spec_proposed
            accepted += stats.num_spec_accepted
    assert accepted > 0 and proposed > accepted  # verified, some proposals kept and some not


def test_constrained_requests_draw_the_same_tokens_with_speculation(tiny):
    """A grammar whose language repeats (so proposals come up); proposals the grammar rejects are
    cut, accepted rows advance the matcher, rejected ones leave no trace."""
    kinds = {"regex": StructuredOutput.from_regex(r"(ab|ba){4,12}c"),
             "json": StructuredOutput.from_json_schema({
                 "type": "array", "items": {"type": "object", "properties": {"id": {"enum": [1, 2]}},
                                            "required": ["id"]}, "minItems": 3, "maxItems": 6})}
    requests = {(kind, seed): ([3 + seed, 40, 41, 40, 41], SamplingParams(
        temperature=temperature, seed=seed, max_tokens=80, structured_output=so))
        for kind, so in kinds.items() for seed in range(4) for temperature in (0.0, 0.8)[seed % 2:seed % 2 + 1]}
    want, want_done, _, _ = outputs(tiny, "off", requests, idle_wait_s=0.05)
    got, got_done, _, stats = outputs(tiny, "ngram", requests, idle_wait_s=0.05)
    assert got == want and got_done == want_done
    assert all(r.label == "stop" for r in got_done.values())
    assert stats.num_spec_accepted > 0


def _triple_probabilities(checkpoint, prompt: list[int], top_k: int) -> dict[tuple[int, ...], float]:
    """The exact distribution of the first three tokens under temperature 1 and top_k, from the
    model's logprobs (decoding without speculation)."""
    greedy = SamplingParams(temperature=0.0, max_tokens=1, logprobs=top_k)

    def top(prefix):
        engine = engine_for(checkpoint, "off")
        engine.add_request(0, prefix, greedy)
        _, _, _, steps = drive(engine)
        lp = next(t.logprobs for out in steps for t in out.tokens)
        weights = [math.exp(v) for v in lp.top_logprobs]
        return {t: w / sum(weights) for t, w in zip(lp.top_token_ids, weights, strict=True)}

    dist = {(): 1.0}
    for _ in range(3):
        dist = {(*k, t): p * q for k, p in dist.items() for t, q in top(prompt + list(k)).items()}
    return dist


def _chi_square(counts: Counter, probabilities: dict, n: int) -> tuple[float, float]:
    """The statistic, with outcomes expected fewer than 5 times pooled into one bin, and its
    p = 0.001 critical value (Wilson-Hilferty). An outcome outside the top-k support: infinite."""
    bins, rare_count, rare_p = [], 0, 0.0
    for k, p in probabilities.items():
        if n * p < 5:
            rare_count, rare_p = rare_count + counts.get(k, 0), rare_p + p
        else:
            bins.append((counts.get(k, 0), p))
    if rare_p:
        bins.append((rare_count, rare_p))
    statistic = sum((c - n * p) ** 2 / (n * p) for c, p in bins)
    if not set(counts) <= set(probabilities):
        statistic = math.inf
    df = len(bins) - 1
    critical = df * (1 - 2 / (9 * df) + 3.0902 * math.sqrt(2 / (9 * df))) ** 3
    return statistic, critical


def _triples(checkpoint, prompt, n: int, top_k: int):
    engine = engine_for(checkpoint, "ngram", max_rows=64)
    for seed in range(n):
        engine.add_request(seed, prompt, SamplingParams(temperature=1.0, top_k=top_k, seed=seed, max_tokens=3,
                                                        ignore_eos=True))
    tokens, _, failed, _ = drive(engine)
    assert not failed
    return Counter(tuple(t) for t in tokens.values()), engine.stats


def test_sampled_speculation_keeps_the_distribution(small, monkeypatch):
    """2,000 seeded draws of three tokens; the second step of each verifies the third token against
    a proposal (the prompt is the model's own greedy text, so proposals come up and some are
    kept). The counts fit p(a) p(b | a) p(c | a b) (chi-square at p = 0.001); accepting every
    proposal, a biased rule, is caught by the same statistic."""
    top_k, n = 3, 2000
    engine = engine_for(small, "off")
    engine.add_request(0, [9, 10, 11], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    prompt = [9, 10, 11] + drive(engine)[0][0]
    probabilities = _triple_probabilities(small, prompt, top_k)
    counts, stats = _triples(small, prompt, n, top_k)
    assert stats.num_spec_proposed >= n // 2 and 0 < stats.num_spec_accepted < stats.num_spec_proposed
    statistic, critical = _chi_square(counts, probabilities, n)
    assert statistic < critical

    def accept_all(self, seq, drawn, now):  # the mutation: every proposal kept, whatever was drawn
        outcomes = []
        for token in seq.proposal:
            outcomes.append(self._take(seq, token, None, now))
            if outcomes[-1].finish_reason is not None:
                return outcomes
        return outcomes + [self._token(seq, drawn[len(seq.proposal)], now)]

    monkeypatch.setattr(Postprocess, "_accepted", accept_all)
    biased, _ = _triples(small, prompt, n, top_k)
    inside = Counter({k: c for k, c in biased.items() if k in probabilities})
    assert len(inside) < len(biased)  # it writes tokens outside the top-k support
    statistic, critical = _chi_square(inside, probabilities, sum(inside.values()))
    assert statistic > critical  # and what stays inside is off too
    statistic, critical = _chi_square(biased, probabilities, n)
    assert statistic > critical
