"""OpenTelemetry for both services: W3C trace context in, spans out only when a collector is named.

    setup("preprocess", otlp_endpoint)           # once, before the server is built
    GrpcServer(..., interceptors=server_interceptors())
    carrier = inject()                           # the current trace, for one request on the internal stream
    span = start_request_span("generation.request", carrier, {...})   # its continuation
    log_fields()                                 # {"trace_id", "span_id"} for every log line (logs.py)

- Every public RPC (and every RPC of the generation service but its long-lived internal `Stream`)
  gets a server span from opentelemetry-instrumentation-grpc, continuing the caller's
  `traceparent` (Envoy's, when its tracer is on; a client's otherwise) or starting a trace.
- The internal stream carries many requests, so each request carries its own trace context in
  `PreprocessInput.trace_context` (W3C `traceparent`/`tracestate`), set from the RPC span that
  admitted it; the generation service continues it with one span per request (queue to finish).
- Export: OTLP/gRPC to `--otlp-endpoint` (or the standard OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT);
  nothing is exported without one. Spans are still made (ids for logs and propagation): cheap,
  and a request's log lines carry a real trace id either way.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

log = logging.getLogger(__name__)

_TRACER_NAME = "mstar"
_ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def otlp_endpoint(flag: str | None) -> str | None:
    """The collector to export to: the flag, else the standard OpenTelemetry variables."""
    return flag or next((os.environ[k] for k in _ENDPOINT_ENV if os.environ.get(k)), None)


def setup(service: str, endpoint: str | None = None) -> TracerProvider:
    """The process's tracer provider (service.name mstar-<service>), exporting only to `endpoint`."""
    provider = TracerProvider(resource=Resource.create({"service.name": f"mstar-{service}"}))
    endpoint = otlp_endpoint(endpoint)
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = not endpoint.startswith("https://")
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure)))
        log.info("tracing: exporting spans", extra={"otlp_endpoint": endpoint})
    trace.set_tracer_provider(provider)
    return provider


def shutdown() -> None:
    """Flush what the exporter still holds (at exit)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


def server_interceptors() -> list:
    """A span per RPC, except health checks, reflection and the internal multiplexed stream (one
    span for a connection's lifetime would say nothing; its requests get spans of their own)."""
    from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

    quiet = filters.any_of(filters.health_check(), filters.service_prefix("grpc.reflection"),
                           filters.method_name("Stream"))
    return [aio_server_interceptor(filter_=filters.negate(quiet))]


def inject() -> dict[str, str]:
    """The current trace context as W3C headers (empty when there is none)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def start_request_span(name: str, carrier: Mapping[str, str], attributes: Mapping[str, object]) -> trace.Span:
    """A span continuing `carrier`'s trace (a new trace when it has none); end it with span.end()."""
    parent = propagate.extract(dict(carrier)) if carrier else otel_context.Context()
    return trace.get_tracer(_TRACER_NAME).start_span(name, context=parent, attributes=dict(attributes))


def log_fields() -> dict[str, str]:
    """trace_id / span_id of the span current where a log line is written, if any."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    return {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}
