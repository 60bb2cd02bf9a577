"""The mask holds under every sampler, even against logits that favour forbidden tokens and EOS."""

import math

import pytest
import torch

from kernels.dispatch import KernelOps
from services.common.structured_output import StructuredOutput, tool_call_tag
from services.generation.grammar.compiler import GrammarCompiler
from services.generation.grammar.matcher import SequenceGrammar
from services.generation.sampler import Sampler
from services.generation.sampling_params import SamplingParams
from services.generation.sequence import Sequence, Timing
from services.generation.weights.random_init import TINY, synthetic_vocabulary

VOCAB = synthetic_vocabulary(TINY.vocab_size)
EOS = 2
SAMPLERS = [
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=2.0, top_k=3),
    dict(temperature=1.0, top_p=0.5),
    dict(temperature=1.0, min_p=0.5),
    dict(temperature=1.0, repetition_penalty=2.0, frequency_penalty=-2.0, presence_penalty=-2.0),
    dict(temperature=1.0, logprobs=4),
]


@pytest.fixture(scope="module")
def compiled():
    return GrammarCompiler(VOCAB, TINY.vocab_size, (EOS,)).submit(StructuredOutput.from_choices(["yes", "no"])).result(60)


def sequence(params: SamplingParams, grammar, seed: int) -> Sequence:
    seq = Sequence(seed, seed, [5, 6, 7], params, seed, Timing(0.0, 0.0))
    seq.grammar = grammar
    return seq


@pytest.mark.parametrize("sampler_params", SAMPLERS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_only_grammar_tokens_are_drawn_and_eos_waits_for_the_end(compiled, sampler_params):
    sampler = Sampler(KernelOps.create(torch.device("cpu")), torch.device("cpu"))
    allowed_first = {VOCAB.tokens.index(t) for t in ("y", "n", "no")}
    for seed in range(20):
        seq = sequence(SamplingParams(**sampler_params), SequenceGrammar(compiled, (EOS,)), seed)
        free = sequence(SamplingParams(**sampler_params), None, seed + 100)
        logits = torch.randn(2, TINY.vocab_size, generator=torch.Generator().manual_seed(seed))
        logits[:, EOS] = 100.0  # the model "wants" to stop at once
        logits[:, VOCAB.tokens.index("x")] = 50.0
        out = sampler(logits, [seq, free])
        assert out.token_ids[0] in allowed_first and out.token_ids[1] == EOS  # the free row is untouched
        lp = out.logprobs[0]
        if lp is not None:  # the masked distribution: what was allowed shares all the mass
            assert set(lp.top_token_ids) <= allowed_first and len(lp.top_token_ids) == 3
            assert math.isclose(sum(math.exp(v) for v in lp.top_logprobs), 1.0, rel_tol=1e-5)


BOUNDED = {"type": "object", "properties": {"c": {"type": "string", "minLength": 1, "maxLength": 3}}, "required": ["c"]}
CALL = '<tool_call>{"name": "f", "arguments": '


@pytest.mark.parametrize("constraint, prefix", [
    (StructuredOutput.from_json_schema(BOUNDED), '{"c": "'),
    (StructuredOutput.for_tool_calls([tool_call_tag(CALL, BOUNDED, "}</tool_call>")], ["<tool_call>"], require_call=True),
     CALL + '{"c": "'),
], ids=["json_schema", "tool_calls"])
def test_a_length_bounded_string_never_gets_a_raw_control_character(constraint, prefix):
    # xgrammar 0.2.9 alone lets TAB into a string with maxLength, which is no longer JSON.
    grammar = SequenceGrammar(GrammarCompiler(VOCAB, TINY.vocab_size, (EOS,)).submit(constraint).result(60), (EOS,))
    assert grammar._matcher.accept_string(prefix)
    sampler = Sampler(KernelOps.create(torch.device("cpu")), torch.device("cpu"))
    logits = torch.zeros(1, TINY.vocab_size)
    logits[0, VOCAB.tokens.index("\t")] = 100.0
    token = sampler(logits, [sequence(SamplingParams(temperature=0.0), grammar, 0)]).token_ids[0]
    assert VOCAB.tokens[token] not in ("\t", "\n", '"', "\\")
