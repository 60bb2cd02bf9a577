"""Structured JSON logs: one object per line with the record's `extra` fields merged in, the
trace_id / span_id of the OpenTelemetry span current where the line was written (tracing.py), and
the `x_request_id` of the RPC being served (request_id.py; Envoy's access log calls it
`request_id`), stamped on each record when it is created (so handlers that format later, or
elsewhere, still see it). String values are capped, so no client input can make a log line
unbounded."""

from __future__ import annotations

import json
import logging
import sys
import time

from services.common import request_id, tracing

# Longest string value written for one key (messages and extra fields; stack traces are exempt).
MAX_VALUE_CHARS = 4096
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _capped(record.getMessage()),
            **tracing.log_fields(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = _capped(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _capped(value: object) -> object:
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        return value[:MAX_VALUE_CHARS] + f"... ({len(value)} characters)"
    return value


_factory_installed = False


def stamp_request_ids() -> None:
    """Give every log record created while an RPC is served its `x_request_id` (idempotent)."""
    global _factory_installed
    if _factory_installed:
        return
    _factory_installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        rid = request_id.current.get()
        if rid is not None:
            record.x_request_id = rid
        return record

    logging.setLogRecordFactory(factory)


def setup_logging(service: str, level: str = "INFO") -> None:
    stamp_request_ids()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger(service).info("logging ready", extra={"service": service, "pid_start": time.time()})
