"""An HTTP client that drops an SSE stream through Envoy frees the request's KV blocks promptly.

Observed from the generation service's own ConductorStatus (a GenerationService.Stream opened
with the `mstar-status-interval-ms` metadata reports kv_blocks_used every 50 ms)."""

from __future__ import annotations

import queue
import threading
import time

import grpc
import httpx
import pytest
from mstar.generation.v1 import generation_service_pb2 as gpb
from mstar.generation.v1 import generation_service_pb2_grpc as gpb_grpc

pytestmark = pytest.mark.e2e


class StatusWatch:
    """Latest engine gauges, refreshed from ConductorStatus frames in a background thread."""

    def __init__(self, target: str) -> None:
        self.latest: dict[str, float] = {}
        self.updated = threading.Condition()
        self._stop = threading.Event()
        self._channel = grpc.insecure_channel(target)
        stub = gpb_grpc.GenerationServiceStub(self._channel)
        self._call = stub.Stream(self._requests(), metadata=[("mstar-status-interval-ms", "50")])
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _requests(self):
        self._stop.wait()  # send nothing; keep the stream open until close()
        return
        yield gpb.StreamRequest()

    def _read(self) -> None:
        try:
            for response in self._call:
                for envelope in response.frames:
                    if envelope.HasField("conductor_status"):
                        with self.updated:
                            self.latest = {m.name: m.value for m in envelope.conductor_status.metrics}
                            self.updated.notify_all()
        except grpc.RpcError:
            pass

    def wait_for(self, predicate, timeout_s: float) -> float | None:
        """Seconds until predicate(latest) held, or None on timeout."""
        start = time.monotonic()
        with self.updated:
            while not (self.latest and predicate(self.latest)):
                left = timeout_s - (time.monotonic() - start)
                if left <= 0:
                    return None
                self.updated.wait(left)
        return time.monotonic() - start

    def close(self) -> None:
        self._stop.set()
        self._call.cancel()
        self._channel.close()


def test_client_disconnect_frees_kv_blocks_within_a_second(stack):
    watch = StatusWatch(stack.generation_target)
    try:
        assert watch.wait_for(lambda s: s["requests_running"] == 0, 30) is not None
        baseline = watch.latest["kv_blocks_used"]
        body = {"model": "default", "stream": True, "max_tokens": 400, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Tell me a very long story."}]}
        chunks: queue.Queue = queue.Queue()
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", stack.http_url + "/v1/chat/completions", json=body) as reply:
                assert reply.status_code == 200
                # Held in a name: an iterator abandoned at `break` is finalized at once, and its
                # GeneratorExit closes the connection (httpcore), which would drop the stream here
                # instead of where this test means to (when the with-blocks exit).
                lines = reply.iter_lines()
                for line in lines:
                    if line.startswith("data: {"):
                        chunks.put(line)
                    if chunks.qsize() >= 3:
                        break
                # Running means holding KV blocks. (Not "used > baseline": the stack is shared by
                # the session, and an earlier test's blocks freed meanwhile can hide ours; seen once.)
                assert watch.wait_for(lambda s: s["requests_running"] >= 1 and s["kv_blocks_used"] > 0, 5) is not None, \
                    watch.latest
                dropped = time.monotonic()
            # leaving both blocks closes the socket mid-stream
        freed_after = watch.wait_for(
            lambda s: s["kv_blocks_used"] <= baseline and s["requests_running"] == 0, 10)
        assert freed_after is not None, f"KV not freed: {watch.latest}"
        latency = time.monotonic() - dropped
        print(f"\ndisconnect -> KV freed in {latency * 1000:.0f} ms")
        assert latency < 1.0
    finally:
        watch.close()
