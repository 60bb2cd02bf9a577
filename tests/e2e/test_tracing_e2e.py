"""OpenTelemetry across the real stack: a client's W3C traceparent is continued by Envoy's tracer,
the preprocess RPC span and the generation service's per-request span (carried on the shared
internal stream), all exported to an OTLP collector (an in-process one here); the trace id is in
Envoy's access log next to the x-request-id and in the services' request log lines."""

from __future__ import annotations

import json
import threading
import time
from concurrent import futures

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from services.stack.ports import free_port
from services.stack.stack import Stack, StackConfig

pytestmark = pytest.mark.e2e

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every exported span as (service.name, span)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []
        self.lock = threading.Lock()

    def Export(self, request, context):
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope in resource_spans.scope_spans:
                    self.spans.extend((service, span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> list[tuple[str, object]]:
        with self.lock:
            return [(s, span) for s, span in self.spans if span.trace_id.hex() == trace_id]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    config = StackConfig.with_free_ports(null_engine=True, otlp_endpoint=f"127.0.0.1:{port}",
                                         log_dir=tmp_path_factory.mktemp("traced"))
    try:
        with Stack(config) as stack:
            yield stack, collector
    finally:
        server.stop(None)


def _wait_spans(collector: Collector, trace_id: str, services: set[str], timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s  # exporters batch: up to ~5 s each
    while time.monotonic() < deadline:
        spans = collector.of_trace(trace_id)
        if services <= {s for s, _ in spans}:
            return spans
        time.sleep(0.2)
    raise AssertionError(f"spans of {trace_id}: {[(s, sp.name) for s, sp in collector.of_trace(trace_id)]}")


def test_a_clients_trace_continues_through_envoy_preprocess_and_generation(traced):
    stack, collector = traced
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT}-01", "x-request-id": "trace-e2e-1"}
    reply = httpx.post(stack.http_url + "/v1/generate", headers=headers, timeout=30,
                       json={"text": "hi", "model_kwargs": {"sampling": {"max_tokens": 3}}})
    assert reply.status_code == 200, reply.text
    spans = _wait_spans(collector, TRACE_ID, {"envoy", "mstar-preprocess", "mstar-generation"})
    by_service = {}
    for service, span in spans:
        by_service.setdefault(service, []).append(span)
    envoy = by_service["envoy"][0]
    # POST /v1/generate is GenerateJson (the raw-body form of Generate, services/preprocess/native_json.py).
    rpc = next(s for s in by_service["mstar-preprocess"] if s.name.endswith("InferenceService/GenerateJson"))
    request = next(s for s in by_service["mstar-generation"] if s.name == "generation.request")
    # One chain: the client's span -> Envoy -> the preprocess RPC -> the generation request.
    assert envoy.parent_span_id.hex() == PARENT
    assert rpc.parent_span_id == envoy.span_id
    assert request.parent_span_id == rpc.span_id
    attrs = {a.key: a.value for a in request.attributes}
    assert attrs["mstar.output_tokens"].int_value == 3 and attrs["mstar.finish_reason"].string_value == "length"

    # Logs: Envoy's access log has the trace id next to its x-request-id (a client's own x-request-id
    # is not trusted at the edge: Envoy makes a new one and forwards it upstream); preprocess's
    # request line has the trace id.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        access = [json.loads(line) for line in (stack.log_dir / "envoy.log").read_text().splitlines()
                  if line.startswith("{") and TRACE_ID in line]
        done = [json.loads(line) for line in (stack.log_dir / "preprocess.log").read_text().splitlines()
                if line.startswith("{") and '"request done"' in line and TRACE_ID in line]
        if access and done:
            break
        time.sleep(0.2)
    assert access and access[0]["trace_id"] == TRACE_ID and access[0]["status"] == 200
    assert access[0]["request_id"] not in ("", "-", "trace-e2e-1")
    assert done and done[0]["trace_id"] == TRACE_ID


def test_without_a_client_trace_envoy_starts_one_and_the_services_continue_it(traced):
    stack, collector = traced
    reply = httpx.post(stack.http_url + "/v1/completions", timeout=30,
                       json={"model": "default", "prompt": "hi", "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        traces = {}
        for service, span in collector.spans:
            if service == "mstar-generation" and span.name == "generation.request":
                traces[span.trace_id.hex()] = span
        new = [t for t in traces if t != TRACE_ID]
        if new and {"envoy", "mstar-preprocess"} <= {s for s, _ in collector.of_trace(new[-1])}:
            return
        time.sleep(0.2)
    raise AssertionError("no trace from Envoy through both services")
