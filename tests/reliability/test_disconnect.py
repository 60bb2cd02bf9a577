"""R01–R05: clients that go away, cancel, or reuse ids. The engine must stop work within a step or
two, free the KV blocks, and end every request with exactly one terminal event."""

from __future__ import annotations

import asyncio
import json
import random
import time

import grpc
import httpx
import pytest
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.generation.v1 import generation_service_pb2_grpc as gen_grpc
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc
from mstar.v1 import messages_pb2 as pb

from tests.reliability import probe
from tests.reliability.conftest import STEP_S

pytestmark = pytest.mark.reliability

LONG = 5000  # tokens: ~100 s at 20 ms/step, so only an abort can end it within the test


def _body(path: str) -> dict:
    if path == "/v1/completions":
        return {"model": "default", "prompt": "Tell me a long story.", "max_tokens": LONG, "stream": True}
    return {"text": "Tell me a long story.", "model_kwargs": {"sampling": {"max_tokens": LONG}}}


@pytest.mark.parametrize("path", ["/v1/generate_stream", "/v1/completions"])
def test_r01_sse_client_disconnect_aborts_generation(rig, figures, path):
    async def scenario() -> float:
        async with httpx.AsyncClient(base_url=rig.http, timeout=30) as client:
            async with client.stream("POST", path, json=_body(path)) as resp:
                assert resp.status_code == 200
                events = 0
                async for line in resp.aiter_lines():
                    events += line.startswith("data:")
                    if events >= 5:  # a few tokens in: the request is running in the engine
                        await probe.wait_running(rig.generation)
                        break  # closing the line iterator closes the response: the client is gone
        t0 = time.monotonic()  # both context managers closed: the connection is gone
        await probe.time_to_idle(rig.generation, rig.kv_baseline)
        return time.monotonic() - t0

    elapsed = rig.run(scenario())
    figures[f"r01_abort_after_disconnect_s{path.replace('/', '_')}"] = round(elapsed, 3)
    assert elapsed < 2.0, f"engine still busy {elapsed:.2f}s after the client left"
    rig.check_recovered()


def test_r02_unary_client_disconnect_aborts_generation(rig, figures):
    async def scenario() -> float:
        body = {"text": "Tell me a long story.", "model_kwargs": {"sampling": {"max_tokens": LONG}}}
        async with httpx.AsyncClient(base_url=rig.http) as client:
            task = asyncio.create_task(client.post("/v1/generate", json=body, timeout=60))
            await probe.wait_running(rig.generation)
            task.cancel()  # closes the connection mid-request
            await asyncio.gather(task, return_exceptions=True)
        return await probe.time_to_idle(rig.generation, rig.kv_baseline)

    elapsed = rig.run(scenario())
    figures["r02_abort_after_unary_disconnect_s"] = round(elapsed, 3)
    assert elapsed < 2.0
    rig.check_recovered()


def test_r03_grpc_cancel_leaves_other_requests_untouched(rig):
    """Cancel one call after its first response and one right after it began; the others share
    the preprocess service's single generation stream and must finish with all their tokens."""

    async def scenario():
        async with grpc.aio.insecure_channel(rig.grpc) as channel:
            stub = api_grpc.InferenceServiceStub(channel)
            keep = [stub.GenerateStream(api.GenerateStreamRequest(input=probe.text_input(max_tokens=30)))
                    for _ in range(3)]
            late = stub.GenerateStream(api.GenerateStreamRequest(input=probe.text_input(max_tokens=LONG)))
            early = stub.GenerateStream(api.GenerateStreamRequest(input=probe.text_input(max_tokens=LONG)))
            early.cancel()  # right after begin: maybe before it reached the engine
            first = await late.read()
            assert first.WhichOneof("event") == "accepted"
            late.cancel()
            kept = await asyncio.gather(*(probe.collect_stream(c) for c in keep))
            assert (await probe.collect_stream(late)).status == grpc.StatusCode.CANCELLED
            return kept

    for record in rig.run(scenario()):
        record.assert_one_terminal()
        assert record.complete is not None, record.events
        assert record.complete.usage.completion_tokens == 30
        assert record.complete.finish_reason == pb.FINISH_REASON_LENGTH
    rig.check_recovered()


def test_r03_session_cancel_one_of_many(rig):
    async def scenario():
        async with grpc.aio.insecure_channel(rig.grpc) as channel:
            stub = api_grpc.InferenceServiceStub(channel)
            send: asyncio.Queue = asyncio.Queue()

            async def requests():
                while (item := await send.get()) is not None:
                    yield item

            call = stub.Session(requests())
            for i in range(4):
                start = probe.text_input(max_tokens=LONG if i == 0 else 20)
                start.request_id = f"s{i}"
                await send.put(api.SessionRequest(start=start))
            records = {f"s{i}": probe.StreamRecord(request_id=f"s{i}") for i in range(4)}
            cancelled = False
            async for msg in call:
                kind = msg.WhichOneof("event")
                rid = getattr(msg, kind).request_id
                records[rid].add(kind, msg)
                if rid == "s0" and kind == "chunk" and not cancelled:
                    cancelled = True
                    await send.put(api.SessionRequest(cancel=api.SessionCancel(request_id="s0")))
                if all(r.terminals for r in records.values()):
                    await send.put(None)  # half-close: the session then ends OK
            return records

    records = rig.run(scenario(), timeout_s=60)
    for rid, record in records.items():
        record.assert_one_terminal()
        assert record.complete is not None, (rid, record.events)
    assert records["s0"].complete.finish_reason == pb.FINISH_REASON_CANCELLED
    assert all(records[f"s{i}"].complete.usage.completion_tokens == 20 for i in (1, 2, 3))
    rig.check_recovered()


def _start(rid: str, prompt_len: int, max_tokens: int) -> gen_pb2.ClientFrame:
    part = pb.PromptPart(modality=pb.MODALITY_TOKENS, token_ids=pb.TokenIds(ids=[7] * prompt_len))
    return gen_pb2.ClientFrame(preprocess_input=pb.PreprocessInput(
        request_id=rid, prompt_parts=[part], model_kwargs=probe.sampling(max_tokens)))


@pytest.mark.parametrize("total", [1000])
def test_r04_abort_at_random_moments_one_terminal_each(rig, total):
    """Requests on one internal stream, each aborted at a random moment: before it reaches the
    engine (same frame), while queued or mid chunked prefill (prompts > the 512-token step
    budget), around its last step, or after it finished. Exactly one terminal event per id."""
    rng = random.Random(1234)

    async def scenario():
        terminals: dict[str, int] = {}
        rows_after_end: list[str] = []
        outbox: asyncio.Queue = asyncio.Queue()

        async def frames():
            while (item := await outbox.get()) is not None:
                yield item

        async with grpc.aio.insecure_channel(rig.generation) as channel:
            call = gen_grpc.GenerationServiceStub(channel).Stream(frames())

            async def read():
                async for response in call:
                    for env in response.frames:
                        kind = env.WhichOneof("frame")
                        if kind == "result_tokens":
                            rows_after_end.extend(r for r in env.result_tokens.request_ids if r in terminals)
                        elif kind in ("request_complete", "request_failed"):
                            rid = getattr(env, kind).request_id
                            terminals[rid] = terminals.get(rid, 0) + 1

            reader = asyncio.create_task(read())
            wave = 100
            for base in range(0, total, wave):
                ids = [f"r{i}" for i in range(base, base + wave)]
                aborts = []
                for rid in ids:
                    prompt = rng.choice([1, 8, 300, 1200])  # 1200 > 512: chunked prefill
                    max_tokens = rng.choice([1, 2, 5])
                    delay = rng.choice([None, 0.0, STEP_S, 2 * STEP_S, 4 * STEP_S, 10 * STEP_S])
                    if delay is None:  # same frame as the start: before the engine saw it
                        await outbox.put(gen_pb2.StreamRequest(frames=[
                            _start(rid, prompt, max_tokens), gen_pb2.ClientFrame(abort=gen_pb2.Abort(request_id=rid))]))
                        continue
                    await outbox.put(gen_pb2.StreamRequest(frames=[_start(rid, prompt, max_tokens)]))
                    aborts.append((delay, rid))

                async def abort_later(delay, rid):
                    await asyncio.sleep(delay)
                    await outbox.put(gen_pb2.StreamRequest(frames=[gen_pb2.ClientFrame(abort=gen_pb2.Abort(request_id=rid))]))

                await asyncio.gather(*(abort_later(d, r) for d, r in aborts))
                # Aborts of finished ids must be no-ops: repeat a few after the fact.
                for rid in rng.sample(ids, 5):
                    await outbox.put(gen_pb2.StreamRequest(frames=[gen_pb2.ClientFrame(abort=gen_pb2.Abort(request_id=rid))]))
            await outbox.put(None)  # half-close: the server ends the stream once all ended
            await asyncio.wait_for(reader, 60)
            return terminals, rows_after_end

    terminals, rows_after_end = rig.run(scenario(), timeout_s=120)
    assert len(terminals) == total, f"{total - len(terminals)} requests never ended"
    doubles = {k: v for k, v in terminals.items() if v != 1}
    assert not doubles, f"requests with more than one terminal event: {list(doubles.items())[:10]}"
    assert not rows_after_end, f"tokens after a terminal event: {rows_after_end[:10]}"
    rig.check_recovered()


def test_r04_cancel_storm_right_after_submission_leaves_nothing_running(rig):
    """200 streams with client-chosen ids, each cancelled a random moment (0-20 ms) after it was
    sent: by gRPC Cancel, by HTTP `:cancel` or by the client going away. A cancel by id travels on
    another call and may reach preprocess before the start does (issue 28: 35 of 200 found nothing
    to cancel, and their requests ran to the deadline). Every one must end cancelled, none at its
    deadline, and the engine must go idle. 32 in flight at a time: within the client's admission
    share, so every start is admitted and races its cancel."""
    rng = random.Random(28)
    total, deadline_s = 200, 10.0  # a storm ends in a few seconds; a lost cancel runs to the deadline
    in_flight = asyncio.Semaphore(32)

    async def scenario():
        async with grpc.aio.insecure_channel(rig.grpc) as channel, \
                httpx.AsyncClient(base_url=rig.http, timeout=deadline_s) as http:
            stub = api_grpc.InferenceServiceStub(channel)

            async def one(i: int):
                async with in_flight:
                    return await cancelled_soon(i)

            async def cancelled_soon(i: int):
                how = rng.choice(["grpc", "http", "disconnect"])
                delay = rng.choice([0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02])
                start = probe.text_input(max_tokens=LONG, ignore_eos=True)
                start.request_id = f"storm-{i}"
                call = stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=deadline_s)
                record = asyncio.create_task(probe.collect_stream(call))
                await asyncio.sleep(delay)
                if how == "grpc":
                    await stub.Cancel(api.CancelRequest(request_id=start.request_id))
                elif how == "http":
                    assert (await http.post(f"/v1/requests/{start.request_id}:cancel", json={})).status_code == 200
                else:
                    call.cancel()
                return how, await record

            return await asyncio.gather(*(one(i) for i in range(total)))

    results = rig.run(scenario(), timeout_s=12 * deadline_s)
    hung = [(how, r.status, r.events[-2:]) for how, r in results
            if r.status == grpc.StatusCode.DEADLINE_EXCEEDED or (r.complete is None and r.status is None)]
    assert not hung, f"{len(hung)} of {total} requests outlived their cancel: {hung[:5]}"
    for how, record in results:
        if how == "disconnect":
            assert record.status == grpc.StatusCode.CANCELLED or record.complete is not None, record
        else:
            record.assert_one_terminal()
            assert record.complete is not None, (how, record.events[-2:], record.status, record.failed)
            assert record.complete.finish_reason == pb.FINISH_REASON_CANCELLED, (how, record.events[-2:])
    rig.check_recovered()


def test_r05_duplicate_id_refused_and_reuse_after_abort_not_crossed(rig):
    async def scenario():
        async with grpc.aio.insecure_channel(rig.grpc) as channel:
            stub = api_grpc.InferenceServiceStub(channel)

            def start(max_tokens: int):
                inp = probe.text_input(max_tokens=max_tokens)
                inp.request_id = "dup-1"
                return stub.GenerateStream(api.GenerateStreamRequest(input=inp))

            first = start(LONG)
            assert (await first.read()).WhichOneof("event") == "accepted"
            dup = await probe.collect_stream(start(3))
            assert dup.status == grpc.StatusCode.ALREADY_EXISTS and not dup.events
            # Cancel the running one and reuse its id at once: the new request must see only
            # its own 3 tokens, never a late frame of the aborted one.
            await stub.Cancel(api.CancelRequest(request_id="dup-1"))
            first_record = await probe.collect_stream(first)
            reused = await probe.collect_stream(start(3))
            return first_record, reused

    first, reused = rig.run(scenario())
    first.assert_one_terminal()
    assert first.complete.finish_reason == pb.FINISH_REASON_CANCELLED
    reused.assert_one_terminal()
    assert reused.complete.usage.completion_tokens == 3, reused.events
    assert reused.complete.finish_reason == pb.FINISH_REASON_LENGTH
    rig.check_recovered()


def test_r05_internal_duplicate_id_ends_the_running_request_once(rig):
    """On the internal stream a start reusing a running id means the client lost track of it: the
    running request is aborted and ends with ONE RequestFailed(ALREADY_EXISTS); no rows follow it
    and the duplicate never runs (refusing only the duplicate gave that id two terminal events,
    issue 13 finding 6)."""

    async def scenario():
        got: list[tuple[str, str, int]] = []

        async def frames():
            yield gen_pb2.StreamRequest(frames=[_start("x", 4, 20)])
            await asyncio.sleep(3 * STEP_S)
            yield gen_pb2.StreamRequest(frames=[_start("x", 4, 2)])

        async with grpc.aio.insecure_channel(rig.generation) as channel:
            async for response in gen_grpc.GenerationServiceStub(channel).Stream(frames()):
                for env in response.frames:
                    kind = env.WhichOneof("frame")
                    if kind == "request_failed":
                        got.append((kind, env.request_failed.request_id, env.request_failed.code))
                    elif kind == "request_complete":
                        c = env.request_complete
                        got.append((kind, c.request_id, c.usage.completion_tokens))
                    elif kind == "result_tokens" and got:
                        got += [("row", rid, 0) for rid in env.result_tokens.request_ids]
        return got

    got = rig.run(scenario(), timeout_s=30)
    assert got == [("request_failed", "x", grpc.StatusCode.ALREADY_EXISTS.value[0])], json.dumps(got)
    rig.check_recovered()


def test_r04_failed_append_ends_request_once(rig):
    """A per-request error raised by the servicer itself (a malformed append) plus the abort it
    causes in the engine must still give that request ONE terminal event, and no rows after it."""

    async def scenario():
        events: list[tuple[str, str]] = []

        async def frames():
            start = _start("bad-append", 4, 50)
            start.preprocess_input.input_modalities.append(pb.MODALITY_TOKENS)  # input stays open
            yield gen_pb2.StreamRequest(frames=[start, _start("ok", 4, 10)])
            await asyncio.sleep(3 * STEP_S)
            bad = pb.ClientAppend(request_id="bad-append", text="text is not allowed on this stream")
            yield gen_pb2.StreamRequest(frames=[gen_pb2.ClientFrame(client_append=bad)])

        async with grpc.aio.insecure_channel(rig.generation) as channel:
            async for response in gen_grpc.GenerationServiceStub(channel).Stream(frames()):
                for env in response.frames:
                    kind = env.WhichOneof("frame")
                    if kind == "result_tokens":
                        events += [("row", r) for r in env.result_tokens.request_ids]
                    elif kind in ("request_complete", "request_failed"):
                        events.append((kind, getattr(env, kind).request_id))
        return events

    events = rig.run(scenario(), timeout_s=30)
    ends = [e for e in events if e[0] != "row" and e[1] == "bad-append"]
    assert ends == [("request_failed", "bad-append")], ends
    assert ("request_complete", "ok") in events
    rig.check_recovered()
