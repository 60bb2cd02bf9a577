"""Issue 28: a fault in one request's own work fails that request alone (services/common/fault_boundary.py).

For every per-request stage of the engine (sample, grammar, token, finish, pool) and of the
servicer (output), a fault raised for one request among 8 in a batch: that request fails with
INTERNAL (reason REQUEST_FAULT, an error id), the other 7 produce exactly the tokens of a run
without the fault, every KV block comes back, and the engine serves the next request at once.
A fault in shared work (the model step) still fails the engine, as before.
"""

from __future__ import annotations

import logging

import pytest
from generation_helpers import drive, make_engine
from grammar_helpers import IDLE_WAIT_S

from services.common.errors import Code
from services.common.fault_boundary import REASON, FaultBoundary, RequestFault
from services.common.serving import State
from services.common.structured_output import StructuredOutput
from services.generation.sampling_params import Embedding, SamplingParams

PROMPTS = {f"r{i}": list(range(10 + i, 22 + 2 * i)) for i in range(8)}


def params_of(i: int) -> SamplingParams:
    """A mixed batch: greedy, seeded sampling, logprobs with and without alternatives, penalties,
    and one constrained request (so the grammar stage runs)."""
    kinds = [
        SamplingParams(temperature=0.0, max_tokens=6),
        SamplingParams(temperature=0.8, seed=7, max_tokens=6),
        SamplingParams(temperature=0.0, logprobs=0, max_tokens=6),
        SamplingParams(temperature=0.0, logprobs=3, max_tokens=6),
        SamplingParams(temperature=1.0, top_k=5, seed=3, max_tokens=6, frequency_penalty=0.5),
        SamplingParams(temperature=0.0, max_tokens=6, structured_output=StructuredOutput.from_choices(["yes", "no"])),
        SamplingParams(temperature=0.7, top_p=0.9, seed=11, logprobs=2, max_tokens=6),
        SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=6),
    ]
    return kinds[i]


def run_batch(checkpoint, inject=None):
    engine = make_engine(checkpoint)
    engine.boundary.inject = inject
    for i, (key, prompt) in enumerate(PROMPTS.items()):
        engine.add_request(key, prompt, params_of(i))
    tokens, completed, failed, _ = drive(engine, idle_wait_s=IDLE_WAIT_S)
    logprobs = {}
    return engine, tokens, completed, failed, logprobs


def faulty(stage: str, victim: str):
    def inject(where: str, key) -> None:
        if where == stage and key == victim:
            raise ZeroDivisionError(f"injected into {stage}")
    return inject


@pytest.fixture(scope="module")
def clean(request):
    checkpoint = request.getfixturevalue("_tiny_checkpoint_and_fingerprint")[0]
    _, tokens, completed, failed, _ = run_batch(checkpoint)
    assert not failed and len(completed) == 8
    return tokens


@pytest.mark.parametrize("stage,victim", [("sample", "r3"), ("sample", "r0"), ("grammar", "r5"),
                                          ("token", "r6"), ("finish", "r2")])
def test_a_fault_in_one_requests_work_fails_only_that_request(tiny_checkpoint, clean, stage, victim, caplog):
    with caplog.at_level(logging.ERROR):
        engine, tokens, completed, failed, _ = run_batch(tiny_checkpoint, faulty(stage, victim))
    assert set(failed) == {victim}
    error = failed[victim].error
    assert error.code == Code.INTERNAL and error.reason == REASON
    assert error.metadata["stage"] == stage and error.metadata["error_id"] in error.message
    assert "ZeroDivisionError" not in error.message  # the client never sees the exception's text
    others = {k: v for k, v in tokens.items() if k != victim}
    assert others == {k: v for k, v in clean.items() if k != victim}  # token for token
    assert set(completed) == set(PROMPTS) - {victim}
    # The stack is logged once, with the request and the error id.
    logged = [r for r in caplog.records if getattr(r, "error_id", None) == error.metadata["error_id"]]
    assert len(logged) == 1 and logged[0].exc_info and logged[0].request_key == victim
    # Nothing leaked, nothing stopped: every block back, the next request served at once.
    assert engine.block_manager.num_used_blocks == 0 and engine.serving.state is not State.FAILED
    engine.add_request("next", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3))
    tokens, completed, failed, _ = drive(engine)
    assert not failed and len(tokens["next"]) == 3
    assert engine.stats.snapshot()["request_faults"] >= 1


def test_a_fault_in_pooling_fails_only_that_embedding(tiny_checkpoint):
    def run(inject=None):
        engine = make_engine(tiny_checkpoint)
        engine.boundary.inject = inject
        for i, (key, prompt) in enumerate(PROMPTS.items()):
            params = SamplingParams(embedding=Embedding()) if i % 2 else SamplingParams(temperature=0.0, max_tokens=4)
            engine.add_request(key, prompt, params)
        vectors = {}
        tokens, completed, failed = {}, {}, {}
        for _ in range(200):
            out = engine.run_once()
            vectors.update({t.key: t.data for t in out.tensors})
            for t in out.tokens:
                tokens.setdefault(t.key, []).append(t.token_id)
            completed.update({c.key: c for c in out.completed})
            failed.update({f.key: f for f in out.failed})
            if not engine.seqs:
                break
        return engine, vectors, tokens, completed, failed

    _, vectors, tokens, _, _ = run()
    engine, faulted_vectors, faulted_tokens, completed, failed = run(faulty("pool", "r3"))
    assert set(failed) == {"r3"} and failed["r3"].error.reason == REASON
    assert faulted_vectors == {k: v for k, v in vectors.items() if k != "r3"}
    assert faulted_tokens == tokens
    assert engine.block_manager.num_used_blocks == 0


def test_every_row_faulting_fails_every_request_but_never_the_engine(tiny_checkpoint):
    def always(stage, key):
        if stage == "sample":
            raise RuntimeError("a sampler bug that hits everyone")
    engine, tokens, completed, failed, _ = run_batch(tiny_checkpoint, always)
    assert set(failed) == set(PROMPTS) and not tokens
    assert all(f.error.reason == REASON for f in failed.values())
    assert engine.serving.state is not State.FAILED and engine.block_manager.num_used_blocks == 0


def test_a_fault_in_the_model_step_is_still_fatal(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    run = engine.runner.run

    def broken(*args, **kwargs):
        raise RuntimeError("the model step broke: shared state")
    engine.runner.run = broken
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=2))
    _, _, failed, _ = drive(engine)
    engine.runner.run = run
    assert failed["a"].error.code == Code.UNAVAILABLE and engine.serving.state is State.FAILED


@pytest.mark.parametrize("top", [0, 1, 5])
def test_logprobs_without_alternatives_are_served(tiny_checkpoint, top):
    """The openai SDK's `logprobs: true` (no top_logprobs), `top_logprobs: 0`, completions
    `logprobs: 0`: the sampled token's logprob and no alternatives (this crashed the engine)."""
    engine = make_engine(tiny_checkpoint)
    engine.add_request("a", [3, 4, 5], SamplingParams(temperature=0.0, logprobs=top, max_tokens=3))
    engine.add_request("b", [3, 4, 6], SamplingParams(temperature=0.9, seed=1, logprobs=0, max_tokens=3))
    events = []
    for _ in range(50):
        out = engine.run_once()
        events += out.tokens
        assert not out.failed
        if not engine.seqs:
            break
    mine = [e.logprobs for e in events if e.key == "a"]
    assert len(mine) == 3 and all(lp.logprob <= 0.0 and len(lp.top_token_ids) == top for lp in mine)
    if top:
        assert all(lp.top_logprobs == sorted(lp.top_logprobs, reverse=True) for lp in mine)


def test_each_retries_alone_only_when_the_batch_fails():
    boundary = FaultBoundary("test", logging.getLogger("test"))
    calls = []

    def run(indices):
        calls.append(list(indices))
        if 2 in indices:
            raise ValueError("row 2 is bad")
        return [i * 10 for i in indices]

    out = boundary.each("stage", ["a", "b", "c", "d"], run)
    assert out[:2] == [0, 10] and out[3] == 30 and isinstance(out[2], RequestFault)
    assert calls == [[0, 1, 2, 3], [0], [1], [2], [3]]
    calls.clear()
    assert boundary.each("stage", ["a", "b"], run) == [0, 10] and calls == [[0, 1]]
    assert boundary.num_faults == {"stage": 1}


def test_a_fault_building_one_requests_frames_fails_only_that_request():
    """The servicer's stage ("output"): a row whose logprobs cannot become protobuf (a real
    TypeError, not an injected one) fails its request; the step's other rows leave as usual."""
    from mstar.generation.v1 import generation_service_pb2 as gen_pb2

    from services.common.serving import ServingState
    from services.generation.outputs import StepOutput, TokenEvent, TokenLogprobs
    from services.generation.servicer import GenerationServicer, _Stream

    aborted = []
    servicer = GenerationServicer(ServingState("generation"))
    servicer.engine = type("E", (), {"abort": staticmethod(aborted.append)})()
    stream = _Stream(7, active={"a", "b", "c"})
    servicer._streams[7] = stream
    out = StepOutput(step=3)
    out.tokens = [TokenEvent((7, "a"), 11, 0, TokenLogprobs(-0.5, [11], [-0.5])),
                  TokenEvent((7, "b"), 12, 0, TokenLogprobs("not a number", [], [])),
                  TokenEvent((7, "c"), 13, 0, None)]
    servicer._dispatch(out)
    response = stream.outbox.get_nowait()
    tokens, failed = response.frames
    assert list(tokens.result_tokens.request_ids) == ["a", "c"]
    assert list(tokens.result_tokens.token_ids) == [11, 13]
    assert [e.logprob for e in tokens.result_tokens.logprobs] == [-0.5, 0.0]
    assert failed.request_failed.request_id == "b" and failed.request_failed.reason == REASON
    assert failed.request_failed.code == gen_pb2.ServerFrame().request_failed.code + Code.INTERNAL
    assert aborted == [(7, "b")] and stream.active == {"a", "c"}
