"""R36-R37 (finding 3 of the outside trial): one client cannot lock the others out of admission.

Real Envoy, preprocess and generation (null engine). Clients are told apart as in production: by
API key when keys are on (R36, gRPC Sessions), else by the client address Envoy trusts (R37, HTTP
from two loopback source addresses, 127.0.0.2 and 127.0.0.3). A client claiming someone else's
identity in headers is still counted as itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import grpc
import httpx
import pytest
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc
from mstar.v1 import messages_pb2 as pb

from tests.e2e.test_metrics_e2e import scrape
from tests.reliability import probe
from tests.reliability.conftest import NULL_STEP

pytestmark = pytest.mark.reliability

KEYS = ("squatter-key", "victim-key")


def test_r36_64_open_sessions_from_one_api_key_do_not_lock_out_another(make_rig, figures):
    """The squatter opens 64 Sessions, each starting a request whose input stays open (the cheap
    way to hold a slot). With the shipped defaults it gets 16 (open inputs per client: 1/4 of the
    64 slots), the other 48 are refused per request with OPEN_INPUT_LIMIT; the victim, with another
    key, is served at once, an open input of its own included."""
    rig = make_rig(generation_args=NULL_STEP, envoy_overrides={"api_keys": KEYS})

    async def scenario():
        squat = (("authorization", f"Bearer {KEYS[0]}"),)
        victim = (("authorization", f"Bearer {KEYS[1]}"),)
        async with grpc.aio.insecure_channel(rig.grpc) as channel:
            stub = api_grpc.InferenceServiceStub(channel)
            sessions = [stub.Session(metadata=squat) for _ in range(64)]
            for i, call in enumerate(sessions):
                await call.write(api.SessionRequest(start=pb.PreprocessInput(
                    request_id=f"squat-{i}", text="a", input_modalities=[pb.MODALITY_TEXT],
                    model_kwargs=probe.sampling(4))))
            first = [await call.read() for call in sessions]
            kinds = [r.WhichOneof("event") for r in first]
            reasons = {r.failed.reason for r in first if r.WhichOneof("event") == "failed"}
            # The victim: a normal request and an open-input one of its own, both admitted.
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            reply = await stub.Generate(api.GenerateRequest(input=probe.text_input("hi", max_tokens=2)),
                                        metadata=victim, timeout=10)
            victim_s = loop.time() - t0
            own = stub.Session(metadata=victim)
            await own.write(api.SessionRequest(start=pb.PreprocessInput(
                request_id="victim-open", text="a", input_modalities=[pb.MODALITY_TEXT],
                model_kwargs=probe.sampling(2))))
            victim_open = (await own.read()).WhichOneof("event")
            metrics = scrape(rig.stack.metrics_urls["preprocess"])  # while everything is held
            for call in [*sessions, own]:
                call.cancel()
            return kinds, reasons, reply, victim_s, victim_open, metrics

    kinds, reasons, reply, victim_s, victim_open, metrics = rig.run(scenario(), timeout_s=60)
    assert kinds.count("accepted") == 16 and kinds.count("failed") == 48, kinds
    assert reasons == {"OPEN_INPUT_LIMIT"}
    assert reply.complete.usage.completion_tokens == 2 and victim_open == "accepted"
    figures["r36_victim_served_in_s"] = round(victim_s, 3)
    assert metrics[("mstar_preprocess_admission_rejections_total", (("reason", "OPEN_INPUT_LIMIT"),))] == 48
    assert metrics[("mstar_preprocess_admission_open_inputs", ())] == 17  # 16 squatting, 1 the victim's
    assert metrics[("mstar_preprocess_admission_clients", ())] == 2
    # Recovered: idle engine, and a canary (straight to preprocess: Envoy wants a key here).
    rig.run(probe.wait_engine_idle(rig.generation, rig.kv_baseline, 15))
    rig.run(probe.canary(rig.preprocess))
    assert rig.run(probe.conductor_status(rig.generation))["requests_running"] == 0


def test_r37_one_address_cannot_take_every_slot_and_cannot_pose_as_another(make_rig, figures):
    """The squatter (127.0.0.2) holds as many long streams as it can; past its share (8 here) it
    gets 429 CLIENT_LIMIT, also when it sends headers naming the victim's address or an API
    client. The victim (127.0.0.3) is served while the squatter holds its share."""
    rig = make_rig(generation_args=NULL_STEP, preprocess_args=("--max-requests-per-client", "8"))
    body = {"text": "Count", "model_kwargs": {"sampling": {"max_tokens": 3000}}}
    spoof = {"x-forwarded-for": "127.0.0.3", "x-mstar-client-address": "127.0.0.3",
             "x-mstar-client": "client-0", "x-envoy-external-address": "127.0.0.3"}

    def client(address: str) -> httpx.AsyncClient:
        transport = httpx.AsyncHTTPTransport(local_address=address)
        return httpx.AsyncClient(base_url=rig.http, transport=transport, timeout=30)

    async def scenario():
        async with contextlib.AsyncExitStack() as stack:
            squatter = await stack.enter_async_context(client("127.0.0.2"))
            statuses, refused = [], []
            for i in range(12):
                headers = spoof if i % 2 else {}
                reply = await stack.enter_async_context(
                    squatter.stream("POST", "/v1/generate_stream", json=body, headers=headers))
                statuses.append(reply.status_code)
                if reply.status_code != 200:
                    refused.append(json.loads(await reply.aread()))
            victim = await stack.enter_async_context(client("127.0.0.3"))
            t0 = asyncio.get_running_loop().time()
            served = await victim.post("/v1/generate", json={"text": "hi", "model_kwargs": {
                "sampling": {"max_tokens": 2}}})
            victim_s = asyncio.get_running_loop().time() - t0
            snapshot = scrape(rig.stack.metrics_urls["preprocess"])
            return statuses, refused, served, victim_s, snapshot  # leaving the stack closes every stream

    statuses, refused, served, victim_s, snapshot = rig.run(scenario(), timeout_s=60)
    assert statuses == [200] * 8 + [429] * 4, statuses
    assert {r["details"][0]["reason"] for r in refused} == {"CLIENT_LIMIT"}, refused
    assert "127.0.0" not in json.dumps(refused)  # the identity is not echoed back
    assert served.status_code == 200, served.text
    figures["r37_victim_served_in_s"] = round(victim_s, 3)
    assert snapshot[("mstar_preprocess_admission_busiest_client_requests", ())] == 8
    assert snapshot[("mstar_preprocess_admission_rejections_total", (("reason", "CLIENT_LIMIT"),))] == 4
    rig.check_recovered()
