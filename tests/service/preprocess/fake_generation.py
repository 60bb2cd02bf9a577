"""A contract-following stand-in for GenerationService used where the model does not matter:
each request "generates" its own prompt tokens back, one per step, honouring max_tokens,
streamed input (ClientAppend / ends), Abort and stop_token_ids. Steps are batched like the real
engine: one StreamResponse per step with a row for every running request. Like the real service it
pushes a ConductorStatus (running / waiting / KV blocks) every `mstar-status-interval-ms` (the
preprocess backend's heartbeat).

For replica tests: `paused` holds every step (requests stay untouched: no token yet), `frozen`
sends nothing at all, not even the status heartbeat, while the stream stays up (a SIGSTOPped
process: nothing it does meanwhile goes out until it thaws), `refuse`
ends every new request with RequestFailed UNAVAILABLE (a draining engine), `started` lists the
request keys this replica received and `prompts` the prompt each arrived with."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.generation.v1 import generation_service_pb2_grpc as gen_grpc
from mstar.v1 import messages_pb2 as pb


class FakeGeneration(gen_grpc.GenerationServiceServicer):
    def __init__(self, step_s: float = 0.002) -> None:
        self.step_s = step_s
        self.aborted: list[str] = []  # public request ids (the internal start's client_request_id)
        self.live: set[str] = set()
        self.public_id: dict[str, str] = {}  # internal key -> public request id
        self.started: list[str] = []
        self.prompts: dict[str, list[int]] = {}  # key -> prompt as first received
        self.paused = False
        self.frozen = False
        self.refuse = False

    async def Stream(self, request_iterator, context):
        requests: dict[str, dict] = {}
        wake = asyncio.Event()
        out: asyncio.Queue = asyncio.Queue()  # status frames and refusals, between steps
        interval_ms = int(dict(context.invocation_metadata() or ()).get("mstar-status-interval-ms", "0") or 0)

        async def tick():
            while True:
                await asyncio.sleep(interval_ms / 1000)
                used = sum(len(r["prompt"]) for r in requests.values()) // 16
                metrics = [gen_pb2.MetricSnapshot(name=n, kind=gen_pb2.METRIC_KIND_GAUGE, value=v) for n, v in (
                    ("requests_running", len(requests)), ("requests_waiting", 0),
                    ("kv_blocks_used", used), ("kv_blocks_free", 1000 - used))]
                out.put_nowait(gen_pb2.StreamResponse(frames=[
                    gen_pb2.ServerFrame(conductor_status=gen_pb2.ConductorStatus(metrics=metrics))]))
                wake.set()

        async def read():
            async for frame in request_iterator:
                for env in frame.frames:
                    kind = env.WhichOneof("frame")
                    if kind == "preprocess_input":
                        m = env.preprocess_input
                        ids = [i for p in m.prompt_parts for i in p.token_ids.ids]
                        self.started.append(m.request_id)
                        self.prompts[m.request_id] = list(ids)
                        if self.refuse:
                            failed = pb.RequestFailed(request_id=m.request_id, code=14, reason="SHUTTING_DOWN")
                            out.put_nowait(gen_pb2.StreamResponse(frames=[gen_pb2.ServerFrame(request_failed=failed)]))
                            continue
                        requests[m.request_id] = {
                            "prompt": ids,
                            "out": 0,
                            "max": m.model_kwargs.sampling.max_tokens or 16,
                            "stop_ids": set(m.model_kwargs.sampling.stop_token_ids),
                            "open": bool(m.input_modalities),
                        }
                        self.live.add(m.request_id)
                        self.public_id[m.request_id] = m.client_request_id
                    elif kind == "client_append":
                        r = requests.get(env.client_append.request_id)
                        if r is not None:
                            r["prompt"] += [i for p in env.client_append.chunks for i in p.token_ids.ids]
                            if env.client_append.ends:
                                r["open"] = False
                                if env.HasField("max_tokens"):  # resolved by preprocess at the input's end
                                    r["max"] = env.max_tokens
                    elif kind == "abort":
                        self.aborted.append(self.public_id.get(env.abort.request_id, env.abort.request_id))
                        r = requests.pop(env.abort.request_id, None)
                        self.live.discard(env.abort.request_id)
                        if r is not None:  # like the engine: an aborted request ends cancelled
                            cancelled.append((env.abort.request_id, r))
                wake.set()

        cancelled: list[tuple[str, dict]] = []
        reader = asyncio.create_task(read())
        ticker = asyncio.create_task(tick()) if interval_ms > 0 else None
        step = 0
        try:
            while True:
                if self.frozen:
                    await asyncio.sleep(0.01)
                    continue
                while cancelled:
                    key, r = cancelled.pop(0)
                    yield gen_pb2.StreamResponse(frames=[_complete(key, pb.FINISH_REASON_CANCELLED, r)])
                while not out.empty():
                    yield out.get_nowait()
                ready = {k: r for k, r in requests.items() if not r["open"]}
                if not ready or self.paused:
                    wake.clear()
                    await (wake.wait() if not self.paused else asyncio.sleep(0.01))
                    continue
                await asyncio.sleep(self.step_s)
                step += 1
                rows, done = [], []
                for key, r in list(ready.items()):
                    if key not in requests:
                        continue
                    token = r["prompt"][r["out"] % max(1, len(r["prompt"]))] if r["prompt"] else 0
                    rows.append((key, token, r["out"]))
                    r["out"] += 1
                    if r["out"] >= r["max"] or token in r["stop_ids"]:
                        done.append(
                            (
                                key,
                                pb.FINISH_REASON_LENGTH if r["out"] >= r["max"] else pb.FINISH_REASON_STOP,
                                r,
                            )
                        )
                        requests.pop(key)
                        self.live.discard(key)
                envs = [
                    gen_pb2.ServerFrame(
                        result_tokens=gen_pb2.ResultTokens(
                            step=step,
                            request_ids=[k for k, _, _ in rows],
                            token_ids=[t for _, t, _ in rows],
                            loop_indices=[i for _, _, i in rows],
                            signal=gen_pb2.SIGNAL_STEP,
                            modality=pb.MODALITY_TOKENS,
                        )
                    )
                ]
                for key, reason, r in done:
                    envs.append(_complete(key, reason, r))
                yield gen_pb2.StreamResponse(frames=envs)
        finally:
            reader.cancel()
            if ticker is not None:
                ticker.cancel()
            for key in requests:
                self.live.discard(key)


def _complete(key: str, reason: int, r: dict) -> gen_pb2.ServerFrame:
    """A RequestComplete with the usage and timings the engine would report (the fake's own clock:
    one step per token; the prompt's first 2 tokens count as cached)."""
    return gen_pb2.ServerFrame(request_complete=pb.RequestComplete(
        request_id=key, finish_reason=reason,
        usage=pb.Usage(prompt_tokens=len(r["prompt"]), completion_tokens=r["out"],
                       cached_prompt_tokens=min(2, len(r["prompt"]))),
        timings=pb.Timings(queue_ms=1.0, prefill_ms=2.0, time_to_first_token_ms=3.0,
                           decode_ms=float(max(0, r["out"] - 1)), e2e_ms=4.0 + r["out"]),
    ))


async def start_fake(port: int = 0, step_s: float = 0.002):
    import grpc

    server = grpc.aio.server()
    fake = FakeGeneration(step_s)
    gen_grpc.add_GenerationServiceServicer_to_server(fake, server)
    h = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(h, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await h.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, fake, bound


async def _main(port: int, step_s: float) -> None:
    server, _, bound = await start_fake(port, step_s)
    print(f"fake generation listening on port {bound}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    import sys

    asyncio.run(_main(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.002))
