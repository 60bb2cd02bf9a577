"""Grammar compiling: off the caller's thread, cached by content in a bounded LRU, errors named and cached."""

import threading

import pytest
import torch
import xgrammar as xgr

from services.common.errors import Code, MstarError
from services.common.structured_output import StructuredOutput
from services.generation.grammar.bitmask import TokenMasks, apply_bitmask, apply_bitmask_by_table
from services.generation.grammar.cache import LruCache
from services.generation.grammar.compiler import GrammarCompiler, GrammarConfig
from services.generation.grammar.matcher import SequenceGrammar
from services.generation.weights.random_init import TINY, synthetic_vocabulary

VOCAB = synthetic_vocabulary(TINY.vocab_size)
EOS = 2


def compiler(**config) -> GrammarCompiler:
    return GrammarCompiler(VOCAB, TINY.vocab_size, (EOS,), GrammarConfig(**config))


def test_lru_cache_bounds_entries_and_bytes_and_keeps_the_recently_used():
    cache = LruCache(max_entries=3, max_bytes=100)
    for key in "abc":
        cache.put(key, key.upper(), 10)
    assert cache.get("a") == "A"  # a is now the most recent
    cache.put("d", "D", 10)
    assert "b" not in cache and len(cache) == 3
    cache.put("e", "E", 85)  # bytes bound: evicts c and a (oldest first), 105 -> 95
    assert set(cache._entries) == {"d", "e"} and cache.num_bytes == 95
    cache.put("huge", "H", 101)  # larger than the whole cache: not kept, nothing evicted
    assert "huge" not in cache and len(cache) == 2
    assert cache.num_evictions == 3 and cache.num_hits == 1


def hold(c: GrammarCompiler, monkeypatch) -> threading.Event:
    """c's compiles wait for the returned event (and check they run on the compile thread)."""
    release = threading.Event()
    real = c._compile_one

    def slow(constraint):
        assert threading.current_thread().name.startswith("grammar-compile")
        release.wait(30)
        return real(constraint)

    monkeypatch.setattr(c, "_compile_one", slow)
    return release


def test_identical_constraints_compile_once_and_later_requests_hit_the_cache(monkeypatch):
    c = compiler()
    release = hold(c, monkeypatch)
    a = c.submit(StructuredOutput.from_regex("[ab]+"))
    b = c.submit(StructuredOutput.from_regex("[ab]+"))  # joins the compile in flight
    release.set()
    assert a is b and a.result(timeout=60) is not None
    hit = c.submit(StructuredOutput.from_regex("[ab]+"))
    assert hit.done() and hit.result() is a.result()
    assert c.num_compiles == 1 and c.cache.num_hits == 1


def test_compiling_never_blocks_the_submitter(monkeypatch):
    c = compiler()
    release = hold(c, monkeypatch)
    future = c.submit(StructuredOutput.from_regex("x"))
    assert not future.done() and c.num_in_flight == 1
    release.set()
    assert future.result(timeout=60) is not None and c.num_in_flight == 0


@pytest.mark.parametrize("constraint, field, words", [
    (StructuredOutput.from_json_schema({"type": "strin"}), "structured_output.json_schema", 'Unsupported type "strin"'),
    (StructuredOutput.from_json_schema({"$ref": "#/defs/x"}), "structured_output.json_schema", "defs"),
    (StructuredOutput.from_json_schema({"type": "string", "minLength": 5, "maxLength": 2}),
     "structured_output.json_schema", "minLength 5 is greater than maxLength 2"),
    (StructuredOutput.from_regex("(ab"), "structured_output.regex", "parenthesis is not closed"),
    (StructuredOutput.from_grammar('root ::= foo'), "structured_output.grammar", 'Rule "foo" is not defined'),
    (StructuredOutput.from_grammar('start ::= "a"'), "structured_output.grammar", 'root rule with name "root"'),
])
def test_a_constraint_that_does_not_compile_fails_with_invalid_argument_naming_why(constraint, field, words):
    c = compiler()
    with pytest.raises(MstarError) as info:
        c.submit(constraint).result(timeout=60)
    e = info.value
    assert e.code == Code.INVALID_ARGUMENT and e.reason == "INVALID_GRAMMAR"
    assert e.field_violations[0].field == field and words in e.message, e.message
    assert "/project/cpp" not in e.message and "Check failed" not in e.message  # xgrammar's noise is gone
    again = c.submit(constraint)  # the failure is cached: no second compile
    assert again.done() and isinstance(again.exception(), MstarError) and c.num_compiles == 1


def test_the_cache_stays_within_its_entry_bound_and_evicted_grammars_recompile():
    c = compiler(cache_entries=2)
    for pattern in ("a+", "b+", "c+"):
        c.submit(StructuredOutput.from_regex(pattern)).result(timeout=60)
    assert len(c.cache) == 2 and c.cache.num_evictions == 1
    assert c.submit(StructuredOutput.from_regex("c+")).done()  # the newest stayed
    c.submit(StructuredOutput.from_regex("a+")).result(timeout=60)  # the oldest was evicted: compiled again
    assert c.num_compiles == 4


def test_the_cache_stays_within_its_byte_bound():
    c = compiler()
    size = c.submit(StructuredOutput.from_regex("a+")).result(timeout=60).memory_size_bytes
    small = compiler(cache_bytes=2 * size + size // 2)
    for pattern in ("a+", "b+", "c+", "d+"):
        small.submit(StructuredOutput.from_regex(pattern)).result(timeout=60)
    assert small.cache.num_bytes <= small.cache.max_bytes and len(small.cache) == 2


def test_a_vocabulary_larger_than_the_logits_is_refused():
    with pytest.raises(ValueError, match="logits"):
        GrammarCompiler(VOCAB, len(VOCAB) - 1, (EOS,))


def test_control_and_padding_ids_are_never_allowed_and_eos_only_at_the_end():
    grammar = SequenceGrammar(compiler().submit(StructuredOutput.from_choices(["ab"])).result(timeout=60), (EOS,))
    masks = TokenMasks()
    logits = torch.zeros(1, TINY.vocab_size)
    masks.apply(logits, [grammar])
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed == [VOCAB.tokens.index("a")]  # no "ab" token: one character at a time
    assert grammar.accept(allowed[0]) and not grammar.accept(EOS)  # incomplete: EOS refused
    assert grammar.accept(VOCAB.tokens.index("b"))
    logits = torch.zeros(1, TINY.vocab_size)
    masks.apply(logits, [grammar])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]
    assert grammar.accept(EOS) and grammar.is_terminated and grammar.num_accepted == 3


def bitmasks(rows: int, words: int, g: torch.Generator) -> dict:
    """Masks as grammars make them: mostly allowed (in a string), mostly blocked (between tokens), noise."""
    allowed = torch.full((rows, words), -1, dtype=torch.int32)
    allowed[:, 1] = 0
    blocked = torch.zeros((rows, words), dtype=torch.int32)
    blocked[:, 2] = 12345
    noise = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=g)
    mixed = torch.cat([allowed[:2], blocked[2:4], noise[4:]])  # one call, both paths
    return {"allowed": allowed, "blocked": blocked, "noise": noise, "mixed": mixed}


def test_applying_a_bitmask_equals_xgrammars_reference_on_every_kind_of_mask_and_row_subset():
    g = torch.Generator().manual_seed(0)
    for vocab in (512, 49_152, 1000):  # 1000: the last int32 word is partly past the vocabulary
        for name, bitmask in bitmasks(5, (vocab + 31) // 32, g).items():
            logits = torch.randn(5, vocab, generator=g)
            for rows in ([0, 1, 2, 3, 4], [1, 3], [4]):
                expected = logits.clone()
                xgr.apply_token_bitmask_inplace(expected, bitmask, indices=rows, backend="torch_native")
                for apply in (apply_bitmask, apply_bitmask_by_table):
                    ours = logits.clone()
                    apply(ours, bitmask, rows)
                    assert torch.equal(ours, expected), (vocab, name, rows, apply.__name__)


def test_a_grammar_with_no_token_for_its_next_character_is_a_dead_end():
    # \x01 is no token of the synthetic vocabulary: nothing can follow the empty output.
    grammar = SequenceGrammar(compiler().submit(StructuredOutput.from_regex("\\x01")).result(timeout=60), (EOS,))
    TokenMasks().apply(torch.zeros(1, TINY.vocab_size), [grammar])
    assert grammar.is_dead_end
