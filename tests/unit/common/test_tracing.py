"""services/common/tracing.py: no export unless configured, W3C context in and out, ids in logs."""

from __future__ import annotations

import json
import logging

from opentelemetry import trace

from services.common import tracing
from services.common.logs import JsonFormatter

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_no_exporter_unless_an_endpoint_is_configured(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.otlp_endpoint(None) is None
    assert tracing.setup("test")._active_span_processor._span_processors == ()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    assert tracing.otlp_endpoint(None) == "http://collector:4317"
    assert tracing.otlp_endpoint("other:4317") == "other:4317"  # the flag wins
    assert len(tracing.setup("test")._active_span_processor._span_processors) == 1


def test_a_request_span_continues_the_carried_trace_and_log_lines_carry_its_ids():
    tracing.setup("test")  # the global provider (the first setup of this process wins)
    span = tracing.start_request_span("generation.request", {"traceparent": TRACEPARENT}, {"k": 1})
    ctx = span.get_span_context()
    assert format(ctx.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert span.parent.span_id == int(TRACEPARENT.split("-")[2], 16)
    with trace.use_span(span, end_on_exit=True):
        carrier = tracing.inject()  # what preprocess puts into PreprocessInput.trace_context
        record = logging.LogRecord("x", logging.INFO, "f", 1, "hello", (), None)
        line = json.loads(JsonFormatter().format(record))
    assert carrier["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]
    assert line["trace_id"] == TRACEPARENT.split("-")[1] and line["span_id"] == format(ctx.span_id, "016x")
    outside = json.loads(JsonFormatter().format(logging.LogRecord("x", logging.INFO, "f", 1, "m", (), None)))
    assert "trace_id" not in outside
    fresh = tracing.start_request_span("generation.request", {}, {})  # no carrier: a trace of its own
    assert fresh.get_span_context().trace_id != ctx.trace_id and fresh.parent is None
    fresh.end()
