"""The RequestRunner every surface and native RPC runs requests through: errors before the first
event, one terminal event, cleanup on every exit path, metrics labelled by surface."""

from __future__ import annotations

import asyncio

import pytest
from surface_harness import EchoBackend, make_runner

from services.common.errors import Code, MstarError
from services.common.finish import FinishReason
from services.common.metrics import PreprocessMetrics
from services.preprocess.backend_events import TokenStep
from services.preprocess.request import Accepted, Chunk, Complete, RequestSpec, Sampling


def spec(**kw) -> RequestSpec:
    return RequestSpec(**{"text": "Hello there", "sampling": Sampling(max_tokens=3), **kw})


async def events_of(runner, s):
    scope = runner.scope()
    try:
        return [e async for e in scope.run(s)]
    finally:
        scope.close()


def test_accepted_then_chunks_then_exactly_one_terminal(runner):
    events = asyncio.run(events_of(runner, spec(surface="messages")))
    assert isinstance(events[0], Accepted) and isinstance(events[-1], Complete)
    assert sum(isinstance(e, Complete) for e in events) == 1
    tok = runner.model.tokenizer
    assert "".join(e.text for e in events if isinstance(e, Chunk)) == tok.decode(tok.encode("Hello there")[:3])
    assert runner.num_running == 0 and runner.deps.admission.requests_in_flight == 0


def test_admission_and_validation_errors_raise_before_any_event(model):
    runner = make_runner(model, max_requests=0)
    with pytest.raises(MstarError) as info:
        asyncio.run(events_of(runner, spec()))
    assert info.value.code == Code.RESOURCE_EXHAUSTED and runner.num_running == 0
    with pytest.raises(MstarError) as info:
        asyncio.run(events_of(make_runner(model), spec(model="other")))
    assert info.value.code == Code.NOT_FOUND


def test_duplicate_running_id_and_draining(model):
    runner = make_runner(model, EchoBackend(hold=True))

    async def go():
        scope = runner.scope()
        first = scope.run(spec(request_id="same"))
        await anext(first)
        with pytest.raises(MstarError) as dup:
            await anext(scope.run(spec(request_id="same")))
        runner.state.drain()
        with pytest.raises(MstarError) as drained:
            await anext(scope.run(spec()))
        scope.close()  # the safety net: every stream of the call
        return dup.value.code, drained.value.code

    assert asyncio.run(go()) == (Code.ALREADY_EXISTS, Code.UNAVAILABLE)
    assert runner.num_running == 0 and runner.deps.backend.aborted


def test_aclose_mid_stream_aborts_and_frees(model):
    backend = EchoBackend(step_s=0.01, hold=True)
    runner = make_runner(model, backend)

    async def go():
        stream = runner.scope().run(spec(sampling=Sampling(max_tokens=100)))
        await anext(stream)
        await anext(stream)
        await stream.aclose()

    asyncio.run(go())
    assert runner.num_running == 0 and len(backend.aborted) == 1
    assert runner.deps.admission.requests_in_flight == 0


def test_cancel_by_id_ends_with_cancelled(model):
    runner = make_runner(model, EchoBackend(step_s=0.01, hold=True))

    async def go():
        stream = runner.scope().run(spec(request_id="c", sampling=Sampling(max_tokens=100)))
        await anext(stream)
        assert runner.cancel("c") and not runner.cancel("nope")
        return [e async for e in stream]

    assert asyncio.run(go())[-1].finish_reason is FinishReason.CANCELLED


def test_metrics_are_labelled_by_surface(model):
    runner = make_runner(model)
    runner.metrics = PreprocessMetrics()
    asyncio.run(events_of(runner, spec(surface="chat.completions")))
    asyncio.run(events_of(runner, spec(surface="responses")))
    samples = {s.labels["surface"] for m in runner.metrics.registry.collect() for s in m.samples
               if s.name == "mstar_preprocess_requests_total"}
    assert samples == {"chat.completions", "responses"}


def test_a_prompt_that_cannot_fit_is_refused_before_the_template(runner, monkeypatch):
    rendered = []
    monkeypatch.setattr(type(runner.model.chat_template), "render",
                        lambda self, *a, **k: rendered.append(1) or "x")
    from services.preprocess.chat_template import ChatMessage

    huge = "word " * (runner.model.context_length * runner.model.tokenizer.max_token_bytes // 5 + 10)
    with pytest.raises(MstarError) as info:
        asyncio.run(events_of(runner, RequestSpec(messages=(ChatMessage("user", huge),), surface="messages")))
    assert info.value.reason == "PROMPT_TOO_LONG" and info.value.field_violations[0].field == "messages"
    assert not rendered


def test_runtime_checks_name_the_field_as_each_surface_spells_it(runner):
    cap = runner.deps.limits.max_tokens_cap
    cases = [("responses", Sampling(max_tokens=cap + 1), "max_output_tokens"),
             ("messages", Sampling(top_k=10**6 - 1), "top_k"),
             ("chat.completions", Sampling(max_tokens=cap + 1), "max_completion_tokens"),
             ("GenerateStream", Sampling(max_tokens=cap + 1), "input.model_kwargs.sampling.max_tokens"),
             ("Session", Sampling(stop_token_ids=(10**6,)), "start.model_kwargs.sampling.stop_token_ids[0]")]
    for surface, sampling, field in cases:
        with pytest.raises(MstarError) as info:
            asyncio.run(events_of(runner, spec(surface=surface, sampling=sampling)))
        assert info.value.field_violations[0].field == field, surface


def test_a_call_past_its_deadline_frees_its_requests_even_if_grpc_never_cancels_the_handler(model):
    # The scope's own timer ends the request at the call's deadline, whatever else does: the
    # reader gets DEADLINE_EXCEEDED. (The missed cancels once blamed on grpc.aio were the
    # wait_for race of the next test.)
    backend = EchoBackend(step_s=0.01, hold=True)
    runner = make_runner(model, backend)
    runner.deps.keepalive_s = 0.05

    async def go():
        scope = runner.scope()
        scope.close_after(0.1)
        stream = scope.run(spec(sampling=Sampling(max_tokens=1000)))
        await anext(stream)
        with pytest.raises(MstarError) as info:
            async for _ in stream:
                pass
        late = scope.run(spec())  # the call is over: nothing new starts
        with pytest.raises(MstarError) as refused:
            await anext(late)
        return info.value.code, refused.value.code

    assert asyncio.run(go()) == (Code.DEADLINE_EXCEEDED, Code.CANCELLED)
    assert runner.num_running == 0 and len(backend.aborted) == 1


def test_a_cancel_landing_with_the_next_event_still_stops_the_request(model):
    # The reader waits for its request's next event; the event and the task's cancellation (the
    # client went away) arrive in the same loop iteration. Python 3.11's asyncio.wait_for returned
    # the event and dropped the cancel: the handler kept streaming to nobody and the request held
    # its admission slot and KV until max_tokens (reliability R18 flaked on a loaded box).
    backend = EchoBackend(hold=True)
    runner = make_runner(model, backend)

    async def go():
        scope = runner.scope()
        stream = scope.run(spec(sampling=Sampling(max_tokens=1000)))

        async def read():
            try:
                async for _ in stream:
                    pass
            finally:
                await stream.aclose()

        await anext(stream)
        reader = asyncio.create_task(read())
        await asyncio.sleep(0.05)  # the echo delivered the prompt; the reader waits for more
        request = next(iter(backend._requests.values()))
        request.deliver(TokenStep(7, None))
        reader.cancel()
        await asyncio.sleep(0.05)
        return reader.cancelled()

    assert asyncio.run(go()), "the reader swallowed its cancellation"
    assert runner.num_running == 0 and len(backend.aborted) == 1
