"""Grammar-constrained decoding through the engine on the tiny random model.

Sampling at temperature > 0 with varied seeds makes the random model wander over everything the
grammar allows, so every check below is about what the mask lets through, not about luck.
"""

import dataclasses
import json
import re
import threading
import time

import jsonschema
import pytest
from grammar_helpers import EOS, constrained, make_engine, parse_calls, run, tool_tags

from services.common.errors import Code
from services.common.finish import FinishReason
from services.common.structured_output import StructuredOutput
from services.generation.engine import Engine, EngineConfig
from services.generation.null_runner import NullRunner
from services.generation.sampling_params import SamplingParams
from services.generation.weights.random_init import TINY, random_checkpoint
from services.generation.weights.vocabulary import RAW, Vocabulary

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", 3, None]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
}
SAMPLERS = {
    "greedy": dict(temperature=0.0),
    "seeded": dict(temperature=1.0),
    "hot": dict(temperature=2.0),
    "top_k": dict(temperature=1.5, top_k=5),
    "top_p": dict(temperature=1.5, top_p=0.7),
    "min_p": dict(temperature=1.5, min_p=0.2),
    "penalties": dict(temperature=1.0, repetition_penalty=1.5, frequency_penalty=1.0, presence_penalty=0.5),
    "logprobs": dict(temperature=1.0, logprobs=3),
}


def prompts(n: int) -> list[list[int]]:
    return [[3 + (7 * i + j) % 90 for j in range(4 + i % 5)] for i in range(n)]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_json_schema_outputs_parse_and_validate_under_every_sampler(tiny_checkpoint, sampler):
    engine = make_engine(tiny_checkpoint)
    so = StructuredOutput.from_json_schema(PERSON)
    requests = {i: (p, constrained(so, seed=i, **SAMPLERS[sampler])) for i, p in enumerate(prompts(6))}
    texts, reasons, tokens, failed = run(engine, requests)
    assert not failed and set(reasons.values()) == {"stop"}
    for key, text in texts.items():
        jsonschema.validate(json.loads(text), PERSON)
        assert tokens[key][-1] == EOS and EOS not in tokens[key][:-1]
    if sampler != "greedy":
        assert len(set(texts.values())) > 1, "the seeds should explore different documents"


def test_regex_choice_and_ebnf_outputs_are_in_their_language(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    regex = r"[a-z]{2,6}@(com|org)\.[0-9]{1,3}"
    choices = ["alpha", "beta", "gamma ray", 'say "hi"\n']
    ebnf = 'root ::= "(" num (op num)* ")"\nnum ::= [1-9] [0-9]?\nop ::= "+" | "-" | " * "'
    kinds = {"regex": StructuredOutput.from_regex(regex), "choice": StructuredOutput.from_choices(choices),
             "ebnf": StructuredOutput.from_grammar(ebnf)}
    requests = {(kind, seed): (p, constrained(so, seed=seed, temperature=1.5))
                for kind, so in kinds.items() for seed, p in enumerate(prompts(5))}
    texts, reasons, _, failed = run(engine, requests)
    assert not failed and set(reasons.values()) == {"stop"}
    for (kind, _), text in texts.items():
        if kind == "regex":
            assert re.fullmatch(regex, text), text
        elif kind == "choice":
            assert text in choices
        else:
            assert re.fullmatch(r"\((?:[1-9][0-9]?)(?:(?:\+|-| \* )[1-9][0-9]?)*\)", text), text


def test_any_json_object_parses_as_an_object(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    so = StructuredOutput.any_json_object()
    texts, reasons, _, failed = run(engine, {i: (p, constrained(so, seed=i, max_tokens=120))
                                             for i, p in enumerate(prompts(6))})
    assert not failed
    for key, text in texts.items():
        if reasons[key] == "stop":
            assert isinstance(json.loads(text), dict)
        else:  # length: an object still open when max_tokens ran out
            assert text.startswith("{")


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = {"weather": WEATHER, "time": TIME}


@pytest.mark.parametrize("parallel", [True, False])
def test_required_tool_calls_are_calls_only_with_valid_arguments(tiny_checkpoint, parallel):
    engine = make_engine(tiny_checkpoint)
    so = StructuredOutput.for_tool_calls(tool_tags(TOOLS), ["<tool_call>"], require_call=True, parallel=parallel)
    texts, reasons, _, failed = run(engine, {i: (p, constrained(so, seed=i, temperature=1.2))
                                             for i, p in enumerate(prompts(6))})
    assert not failed and (set(reasons.values()) == {"stop"} or parallel)  # parallel: calls until EOS or length
    for key, text in texts.items():
        calls, rest = parse_calls(text)
        assert text.startswith("<tool_call>") and calls, text
        assert len(calls) == 1 or parallel
        if reasons[key] == "stop":
            assert set(rest) <= {"\n"}, text  # nothing but the separators between the calls
        for name, arguments in calls:
            jsonschema.validate(arguments, TOOLS[name])


def test_a_named_tool_choice_is_exactly_that_call(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    so = StructuredOutput.for_tool_calls(tool_tags({"time": TIME}), ["<tool_call>"], require_call=True, parallel=False)
    texts, _, _, _ = run(engine, {i: (p, constrained(so, seed=i)) for i, p in enumerate(prompts(4))})
    for text in texts.values():
        [(name, arguments)], rest = parse_calls(text)
        assert name == "time" and arguments["zone"] in ("UTC", "CET") and rest == ""


def test_auto_tool_calls_allow_free_text_and_every_call_is_well_formed(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    so = StructuredOutput.for_tool_calls(tool_tags(TOOLS), ["<tool_call>"])
    texts, reasons, _, failed = run(engine, {i: (p, constrained(so, seed=i, max_tokens=60))
                                             for i, p in enumerate(prompts(8))})
    assert not failed
    for key, text in texts.items():
        calls, rest = parse_calls(text)
        if reasons[key] == "stop":  # a call cut by max_tokens cannot be parsed; a finished output can
            assert "<tool_call>" not in rest, text
        for name, arguments in calls:
            jsonschema.validate(arguments, TOOLS[name])
    assert any(not parse_calls(t)[0] and t for t in texts.values()), "auto allows plain text"


def test_preempted_requests_resume_their_grammar_where_it_was(tiny_checkpoint):
    so = StructuredOutput.from_json_schema(PERSON)
    requests = {i: (p * 3, constrained(so, seed=i, max_tokens=40)) for i, p in enumerate(prompts(6))}
    roomy, _, roomy_tokens, _ = run(make_engine(tiny_checkpoint, num_blocks=256), requests)
    tight = make_engine(tiny_checkpoint, num_blocks=24, block_size=4)  # 96 slots for 6 x (~20 + 40)
    for key, (prompt, params) in requests.items():
        tight.add_request(key, prompt, params)
    tokens: dict = {}
    while tight.seqs or not tight._commands.empty():
        out = tight.run_once(0.05)
        assert not out.failed
        for event in out.tokens:
            tokens.setdefault(event.key, []).append(event.token_id)
        for seq in tight.seqs.values():  # the matcher moves once per sampled token, never on recompute
            assert seq.grammar is None or seq.grammar.num_accepted == seq.num_output_tokens
    assert tight.scheduler.num_preemptions > 0, "the pool was meant to force preemptions"
    assert tokens == roomy_tokens


def test_a_schema_that_does_not_compile_fails_alone(tiny_checkpoint):
    good = {"json": ([5, 6, 7], constrained(StructuredOutput.from_json_schema(PERSON), seed=1)),
            "free": ([8, 9], SamplingParams(temperature=1.0, seed=2, max_tokens=12)),
            "choice": ([10], constrained(StructuredOutput.from_choices(["yes", "no"]), seed=3))}
    alone, _, alone_tokens, _ = run(make_engine(tiny_checkpoint), good)
    bad = {"schema": ([5], constrained(StructuredOutput.from_json_schema({"type": "object", "required": 3}))),
           "regex": ([5], constrained(StructuredOutput.from_regex("[z-a]")))}
    texts, reasons, tokens, failed = run(make_engine(tiny_checkpoint), bad | good)
    assert set(failed) == {"schema", "regex"} and tokens == alone_tokens
    for key, field in (("schema", "structured_output.json_schema"), ("regex", "structured_output.regex")):
        error = failed[key].error
        assert error.code == Code.INVALID_ARGUMENT and error.reason == "INVALID_GRAMMAR"
        assert error.field_violations[0].field == field and "does not compile" in error.message


def test_bad_constraints_are_refused_at_admission_naming_the_field(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    _, _, _, failed = run(engine, {
        "empty": ([5], constrained(StructuredOutput.from_choices([]))),
        "kind": ([5], constrained(StructuredOutput("xml"))),
    })
    assert {k: f.error.field_violations[0].field for k, f in failed.items()} == {
        "empty": "structured_output.choices", "kind": "structured_output.kind"}
    assert all(f.error.code == Code.INVALID_ARGUMENT for f in failed.values())
    assert engine.grammars.compiler.num_compiles == 0


def test_without_a_usable_vocabulary_structured_output_is_unavailable(tiny_checkpoint):
    too_long = Vocabulary(tuple(f"t{i}" for i in range(TINY.vocab_size + 1)), RAW, frozenset())
    for runner in (NullRunner(), make_engine(dataclasses.replace(tiny_checkpoint, vocabulary=too_long)).runner):
        engine = Engine(runner, EngineConfig(), on_step=lambda out: None)
        engine.add_request("a", [1, 2], constrained(StructuredOutput.from_regex("a")))
        out = engine.run_once()
        assert out.failed[0].error.reason == "STRUCTURED_OUTPUT_UNAVAILABLE"
        assert out.failed[0].error.code == Code.FAILED_PRECONDITION


def hold_compiles(engine: Engine, monkeypatch) -> threading.Event:
    """Compiles on this engine wait for the returned event."""
    compiler = engine.grammars.compiler
    release, real = threading.Event(), compiler._compile_one
    monkeypatch.setattr(compiler, "_compile_one", lambda c: release.wait(30) and real(c))
    return release


def test_a_request_waiting_for_its_grammar_prefills_and_does_not_stall_the_batch(tiny_checkpoint, monkeypatch):
    engine = make_engine(tiny_checkpoint)
    release = hold_compiles(engine, monkeypatch)
    prompt = list(range(10, 30))
    engine.add_request("c", prompt, constrained(StructuredOutput.from_choices(["yes", "no"])))
    engine.add_request("u", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    produced = [engine.run_once() for _ in range(10)]
    assert [len([t for t in out.tokens if t.key == "u"]) for out in produced] == [1] * 10
    assert not any(t.key == "c" for out in produced for t in out.tokens)
    assert engine.seqs["c"].num_computed_tokens == len(prompt) - 1 and engine.seqs["c"].is_waiting_for_grammar
    release.set()
    texts, reasons, _, failed = run(engine, {})
    assert not failed and texts["c"] in ("yes", "no") and reasons["c"] == "stop"


def test_abort_while_compiling_frees_everything_and_a_reused_key_is_not_crossed(tiny_checkpoint, monkeypatch):
    engine = make_engine(tiny_checkpoint)
    release = hold_compiles(engine, monkeypatch)
    so = StructuredOutput.from_choices(["one", "two"])
    engine.add_request("c", [5, 6, 7, 8, 9], constrained(so))
    engine.run_once()
    engine.abort("c")
    out = engine.run_once()
    assert [(c.key, c.finish_reason) for c in out.completed] == [("c", FinishReason.CANCELLED)]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    engine.add_request("c", [5], constrained(StructuredOutput.from_regex("[0-9]{3}")))  # same key, new request
    release.set()
    texts, reasons, _, failed = run(engine, {})  # the first compile's late "ready" must not reach it
    assert not failed and re.fullmatch("[0-9]{3}", texts["c"]) and reasons["c"] == "stop"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_abort_mid_generation_frees_the_request(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("c", [5, 6], constrained(StructuredOutput.from_json_schema(PERSON)))
    engine.run_once()
    while not (engine.seqs["c"].grammar and engine.seqs["c"].num_output_tokens >= 3):
        engine.run_once(0.05)
    engine.abort("c")
    assert engine.run_once().completed[0].finish_reason is FinishReason.CANCELLED
    assert not engine.seqs and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_the_grammar_ending_finishes_the_request_even_when_eos_is_ignored(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    so = StructuredOutput.from_choices(["ok"])
    texts, reasons, tokens, _ = run(engine, {"a": ([5], constrained(so, ignore_eos=True, max_tokens=50)),
                                             "b": ([6], constrained(so, max_tokens=50))})
    assert texts == {"a": "ok", "b": "ok"} and reasons == {"a": "stop", "b": "stop"}
    assert tokens["a"][-1] == EOS == tokens["b"][-1]


def test_max_tokens_wins_over_an_unfinished_grammar(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    texts, reasons, tokens, _ = run(engine, {"a": ([5], constrained(StructuredOutput.from_json_schema(PERSON),
                                                                    max_tokens=3))})
    assert reasons["a"] == "length" and len(tokens["a"]) == 3 and texts["a"].startswith('{"')


def test_a_model_without_eos_ends_where_the_grammar_completes():
    config = dataclasses.replace(TINY, eos_token_ids=())
    engine = make_engine(random_checkpoint(config, seed=0))
    texts, reasons, tokens, _ = run(engine, {i: ([5 + i], constrained(StructuredOutput.from_choices(["ab", "cd"]),
                                                                      seed=i)) for i in range(4)})
    assert set(texts.values()) <= {"ab", "cd"} and set(reasons.values()) == {"stop"}
    assert all(len(t) == 2 for t in tokens.values())  # no stop token: the last character ends it


def test_unconstrained_rows_are_untouched_by_constrained_batch_mates(tiny_checkpoint):
    free = {f"free{i}": (p, SamplingParams(temperature=1.0, seed=i, max_tokens=10)) for i, p in enumerate(prompts(3))}
    _, _, alone, _ = run(make_engine(tiny_checkpoint), free)
    so = StructuredOutput.from_json_schema(PERSON)
    mixed = free | {f"json{i}": (p, constrained(so, seed=i)) for i, p in enumerate(prompts(3))}
    _, _, tokens, failed = run(make_engine(tiny_checkpoint), mixed)
    assert not failed and {k: tokens[k] for k in free} == alone


def test_logprobs_are_those_of_the_masked_distribution(tiny_checkpoint):
    import math

    engine = make_engine(tiny_checkpoint)
    events = []
    engine.on_step = None
    engine.add_request("a", [5, 6], constrained(StructuredOutput.from_choices(["alpha", "beta"]), logprobs=5))
    while engine.seqs or not engine._commands.empty():
        events += engine.run_once(0.05).tokens
    first = events[0].logprobs  # allowed first tokens: "a", "al", "b" (the vocabulary's spellings)
    spelled = [engine.runner.vocabulary.tokens[t] for t in first.top_token_ids]
    assert sorted(spelled) == ["a", "al", "b"] and math.isclose(sum(map(math.exp, first.top_logprobs)), 1, rel_tol=1e-4)
    assert all(e.logprobs.logprob > -math.inf for e in events)
    last = events[-1].logprobs  # the grammar is complete: EOS is the only possible token
    assert last.top_token_ids == [EOS] and last.logprob == pytest.approx(0.0, abs=1e-6)


def test_streamed_input_then_grammar(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("s", [5, 6, 7], constrained(StructuredOutput.from_regex("[a-z]{3}")), input_done=False)
    engine.run_once(0.05)
    engine.append("s", [8, 9], input_done=True)
    texts, reasons, _, _ = run(engine, {})
    assert re.fullmatch("[a-z]{3}", texts["s"]) and reasons["s"] == "stop"


def test_a_loop_whose_running_requests_all_wait_for_grammars_sleeps_instead_of_spinning(tiny_checkpoint, monkeypatch):
    engine = make_engine(tiny_checkpoint, max_num_seqs=2)
    release = hold_compiles(engine, monkeypatch)
    for key in "abc":  # two run (and wait), the third waits for a slot
        engine.add_request(key, [5, 6], constrained(StructuredOutput.from_regex("[0-9]")))
    engine.run_once()  # admits a and b, prefills their first token
    engine.run_once()  # finds nothing it can schedule: stalled
    calls = []
    real = engine.scheduler.schedule
    monkeypatch.setattr(engine.scheduler, "schedule", lambda: calls.append(1) or real())
    start = time.monotonic()
    engine.run_once(0.2)
    engine.run_once(0.2)
    assert time.monotonic() - start >= 0.3 and len(calls) <= 2  # it waited for a command each time
    release.set()
    texts, reasons, _, failed = run(engine, {})
    assert not failed and sorted(texts) == ["a", "b", "c"] and set(reasons.values()) == {"stop"}


def test_compiles_and_cache_hits_are_in_the_engine_status(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    so = StructuredOutput.from_regex("[0-9]{2}")
    run(engine, {"a": ([5], constrained(so))})
    run(engine, {"b": ([6], constrained(so)), "c": ([7], constrained(StructuredOutput.from_regex("x")))})
    status = engine.stats.snapshot()
    assert (status["grammar_compiles"], status["grammar_cache_hits"], status["grammar_compiles_in_flight"]) == (2, 1, 0)
