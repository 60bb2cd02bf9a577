"""Engine behaviour on a tiny model: streamed input, aborts, per-request failures, crashes."""

import threading
import time
from dataclasses import replace

import torch
from generation_helpers import drive, make_engine

from services.common.errors import Code
from services.common.finish import FinishReason
from services.common.serving import State
from services.generation.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def test_streamed_input_is_prefilled_as_it_arrives_and_matches_one_shot(tiny_checkpoint):
    prompt = list(range(10, 40))
    one_shot = make_engine(tiny_checkpoint)
    one_shot.add_request("a", prompt, GREEDY)
    expected, _, _, _ = drive(one_shot)

    engine = make_engine(tiny_checkpoint)
    engine.add_request("a", prompt[:10], GREEDY, input_done=False)
    engine.run_once()
    assert engine.seqs["a"].num_computed_tokens == 9  # everything but the held-back last token
    engine.append("a", prompt[10:25], input_done=False)
    engine.run_once()
    assert engine.seqs["a"].num_computed_tokens == 24
    engine.append("a", prompt[25:], input_done=True)
    first = engine.run_once()  # one step after the input ended: the first token comes out
    assert [t.key for t in first.tokens] == ["a"]
    tokens, completed, _, _ = drive(engine)
    assert [first.tokens[0].token_id] + tokens["a"] == expected["a"]
    assert completed["a"].num_prompt_tokens == 30


def test_abort_frees_blocks_within_a_step_and_is_idempotent(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("a", list(range(3, 20)), SamplingParams(temperature=0.0, max_tokens=50))
    engine.add_request("b", list(range(3, 12)), GREEDY)
    engine.run_once()
    engine.run_once()
    engine.abort("a")
    engine.abort("nope")  # unknown: no-op
    out = engine.run_once()
    assert [c.key for c in out.completed] == ["a"] and out.completed[0].finish_reason is FinishReason.CANCELLED
    assert "a" not in engine.seqs
    tokens, completed, failed, _ = drive(engine)
    engine.abort("a")  # finished: no-op
    assert engine.run_once().completed == []
    assert set(completed) == {"b"} and not failed
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_bad_requests_fail_alone_with_invalid_argument(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("ok", [5, 6, 7], GREEDY)
    engine.add_request("vocab", [5, 10_000], GREEDY)
    engine.add_request("long", list(range(3, 259)), GREEDY)  # context is 256
    engine.add_request("temp", [5], SamplingParams(temperature=-1.0))
    engine.add_request("empty", [], GREEDY)
    tokens, completed, failed, _ = drive(engine)
    assert set(completed) == {"ok"} and len(tokens["ok"]) == 8
    assert {k: f.error.reason for k, f in failed.items()} == {
        "vocab": "TOKEN_OUT_OF_VOCAB", "long": "PROMPT_TOO_LONG", "temp": "INVALID_FIELD", "empty": "EMPTY_PROMPT"}
    assert all(f.error.code == Code.INVALID_ARGUMENT for f in failed.values())


def test_duplicate_key_and_append_after_end(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("a", [5, 6, 7], GREEDY)
    engine.add_request("a", [5, 6, 7], GREEDY)
    out = engine.run_once()
    assert out.failed[0].error.code == Code.ALREADY_EXISTS and "a" in engine.seqs
    engine.append("a", [9], input_done=True)
    out = engine.run_once()
    assert out.failed[0].error.code == Code.FAILED_PRECONDITION and "a" not in engine.seqs


def test_max_tokens_is_checked_never_clamped_and_an_open_inputs_comes_with_its_end(tiny_checkpoint):
    """Preprocess resolves max_tokens once (its clamp, its warning); the engine only refuses one
    that does not fit the context, and an open input's resolved value arrives with its last append."""
    engine = make_engine(tiny_checkpoint, num_blocks=128)  # context 256
    engine.add_request("big", list(range(3, 253)), SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True))
    engine.add_request("fits", list(range(3, 253)), SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    engine.add_request("open", [3, 4], SamplingParams(temperature=0.0, max_tokens=250, ignore_eos=True),
                       input_done=False)
    engine.append("open", list(range(5, 253)), input_done=True, max_tokens=3)
    engine.add_request("unset", list(range(3, 250)), SamplingParams(temperature=0.0, ignore_eos=True))
    tokens, completed, failed, _ = drive(engine)
    assert set(failed) == {"big"} and failed["big"].error.reason == "MAX_TOKENS_TOO_LARGE"
    assert failed["big"].error.field_violations[0].field == "max_tokens"
    assert (len(tokens["fits"]), len(tokens["open"]), len(tokens["unset"])) == (6, 3, 9)  # unset: what fits
    assert completed["fits"].finish_reason is FinishReason.LENGTH


def test_prefix_cache_hits_are_reported(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    prompt = list(range(3, 30))
    engine.add_request("a", prompt, GREEDY)
    first, _, _, _ = drive(engine)
    engine.add_request("b", prompt, GREEDY)
    again, completed, _, _ = drive(engine)
    assert completed["b"].num_cached_tokens == 24 and again["b"] == first["a"]
    assert engine.stats.snapshot()["prefix_cache_hit_rate"] > 0


def test_non_finite_logits_fail_only_that_request(tiny_checkpoint):
    # A private copy of the embedding: the session's checkpoint is shared and must stay intact.
    embed = tiny_checkpoint.tensors["model.embed_tokens.weight"].clone()
    embed[13] = float("nan")  # token 13 poisons its own sequence
    poisoned = replace(tiny_checkpoint, tensors={**tiny_checkpoint.tensors, "model.embed_tokens.weight": embed})
    engine = make_engine(poisoned)
    engine.add_request("bad", [5, 13, 6], GREEDY)
    engine.add_request("good", [5, 12, 6], GREEDY)
    tokens, completed, failed, _ = drive(engine)
    assert set(failed) == {"bad"} and failed["bad"].error.code == Code.INTERNAL
    assert failed["bad"].error.reason == "NON_FINITE_LOGITS" and len(tokens["good"]) == 8
    assert all(torch.isfinite(k).all() for k in engine.runner.kv_cache.k)  # its blocks were scrubbed


def test_a_crashed_step_fails_everyone_and_rejects_new_requests(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("a", [5, 6], GREEDY)
    engine.add_request("b", [7, 8], GREEDY)
    engine.run_once()

    def boom(*args, **kwargs):
        raise RuntimeError("kaboom")

    engine.runner.run = boom
    out = engine.run_once()
    assert {f.key for f in out.failed} == {"a", "b"} and all(f.error.code == Code.UNAVAILABLE for f in out.failed)
    assert engine.serving.state is State.FAILED and engine.serving.refusal().reason == "ENGINE_FAILED"
    engine.add_request("c", [5], GREEDY)
    assert engine.run_once().failed[0].error.code == Code.UNAVAILABLE


def test_loop_thread_reports_steps_through_the_callback(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    seen, done = [], threading.Event()

    def on_step(out):
        seen.append(out)
        if out.completed:
            done.set()

    engine.on_step = on_step
    engine.start()
    try:
        engine.add_request("a", [5, 6, 7], GREEDY)
        assert done.wait(10)
    finally:
        engine.stop()
    assert sum(len(o.tokens) for o in seen) == 8
    assert all(len({t.key for t in o.tokens}) == len(o.tokens) for o in seen)  # one row per request per step
    time.sleep(0)


def test_a_step_is_reported_right_before_the_next_model_run_and_the_last_one_at_once(tiny_checkpoint):
    # While more steps follow, step N's output is handed over from step N+1's on_launch (inputs
    # prepared, model not yet run: the event loop's work overlaps the GIL-free step); the step
    # after which the engine would wait is reported without waiting for another.
    engine = make_engine(tiny_checkpoint)
    events, done = [], threading.Event()
    run = engine.runner.run

    def recording_run(seqs, num_new_tokens, sampling, pooling=None, on_launch=None):
        def launch():
            events.append("launch")
            on_launch()

        result = run(seqs, num_new_tokens, sampling, pooling, on_launch=launch)
        events.append("ran")
        return result

    def on_step(out):
        events.append(("report", out.step))
        if out.completed:
            done.set()

    engine.runner.run, engine.on_step = recording_run, on_step
    engine.start()
    try:
        engine.add_request("a", [5, 6, 7], replace(GREEDY, max_tokens=4))
        assert done.wait(10)
    finally:
        engine.stop()
    assert events == ["launch", "ran",
                      "launch", ("report", 0), "ran",
                      "launch", ("report", 1), "ran",
                      "launch", ("report", 2), "ran", ("report", 3)]


def test_the_loop_runs_on_the_torch_thread_that_built_the_runner(tiny_checkpoint):
    # One thread runs torch in the service: model load, warm-up and every step (a second live
    # OpenMP pool throttles each parallel region, services/generation/torch_thread.py).
    from services.generation.torch_thread import TorchThread

    torch_thread = TorchThread()
    builder = torch_thread.submit(threading.get_ident).result(10)
    engine = make_engine(tiny_checkpoint)
    stepped_on, done = set(), threading.Event()

    def on_step(out):
        stepped_on.add(threading.get_ident())
        if out.completed:
            done.set()

    engine.on_step = on_step
    engine.start(torch_thread)
    try:
        engine.add_request("a", [5, 6, 7], GREEDY)
        assert done.wait(10)
    finally:
        engine.stop()
        torch_thread.shutdown()
    assert stepped_on == {builder} != {threading.get_ident()}
    assert engine._loop_done.done()  # stop() ended the loop it submitted
