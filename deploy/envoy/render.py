"""Render deploy/envoy/envoy.yaml.tmpl into a concrete Envoy config.

    python -m deploy.envoy.render --variant local --out /tmp/envoy.yaml [--http-port 8080 ...]

Variants differ only in addresses and how the upstream is found:
  local    listener and admin on 127.0.0.1, upstream STATIC 127.0.0.1 ports, one per preprocess
           replica (`make run`, tests)
  compose  listener on 0.0.0.0, upstream `preprocess` resolved by STRICT_DNS (every replica of the
           scaled compose service)
  k8s      listener on 0.0.0.0, upstream the headless Service `preprocess` (STRICT_DNS finds every pod)
  pod      listener on 0.0.0.0, upstream STATIC 127.0.0.1:50051: the preprocess container of the same
           pod (deploy/k8s/inference-pool: one pod = preprocess + generation + Envoy, behind a Gateway)
The admin interface always stays on 127.0.0.1: it can shut Envoy down and must not be public.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import string
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from deploy.envoy import api_errors
from services.common.errors import HTTP_STATUS, Code

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TEMPLATE = HERE / "envoy.yaml.tmpl"
HYGIENE_LUA = HERE / "request_hygiene.lua"
DEFAULT_DESCRIPTOR = ROOT / "gen" / "descriptor.pb"


@dataclass(frozen=True)
class EnvoySettings:
    http_port: int = 8080
    admin_port: int = 9901
    listen_address: str = "127.0.0.1"
    admin_address: str = "127.0.0.1"
    upstream_host: str = "127.0.0.1"
    upstream_port: int = 50051
    # More preprocess replicas on upstream_host (local processes, `make run` with
    # MSTAR_PREPROCESS_REPLICAS): every port is one endpoint. Empty: upstream_port alone.
    upstream_ports: tuple[int, ...] = ()
    num_retries: int = 3  # a refused / undelivered new request is tried again on other replicas (previous_hosts)
    cluster_type: str = "STATIC"
    descriptor_path: str = str(DEFAULT_DESCRIPTOR)
    # Timeouts and limits (docs/http.md explains each).
    request_headers_timeout: str = "10s"
    stream_idle_timeout: str = "300s"
    max_stream_duration: str = "1800s"
    unary_timeout: str = "30s"
    health_check_interval: str = "1s"
    max_request_headers_kb: int = 64  # enforced per request (431) by request_hygiene.lua
    max_request_headers_count: int = 100  # header fields, likewise (Envoy's own default count)
    # The codec's own limit, above the policy one: over HTTP/2 a header field past it is an HPACK
    # error that closes the client's whole connection (every stream on it), not just one request.
    codec_max_request_headers_kb: int = 128
    max_request_body_bytes: int = 4 * 1024 * 1024
    max_response_body_bytes: int = 64 * 1024 * 1024
    # Optional edge security, OFF by default (docs/reliability.md, R26/R27). api_keys: accepted as
    # "Authorization: Bearer KEY" or "x-api-key: KEY" (401 otherwise) and stripped before the
    # upstream, which learns only the key's name (api_key_client) in x-mstar-client: the principal
    # that owns what the request stores. rate_limit_rps: requests per second per Envoy (429 past
    # it; streams in flight are never cut). /health is answered before both, so probes need no key.
    api_keys: tuple[str, ...] = ()
    rate_limit_rps: int = 0
    # With API keys off, a client-sent x-mstar-client is removed, unless this is set: a deployment
    # whose own authenticating proxy sits in front of Envoy (and overwrites x-mstar-client with the
    # user it authenticated) passes that identity through. With keys on, the key decides.
    trust_client_identity: bool = False
    # Proxies in front of Envoy whose X-Forwarded-For entries are trusted (0: Envoy is the edge;
    # 1 behind a cloud load balancer that appends the client address). Decides the client address
    # preprocess shares admission by.
    xff_num_trusted_hops: int = 0
    # OpenTelemetry export of Envoy's spans (OTLP/gRPC), off unless a collector is named here.
    otlp_host: str = ""
    otlp_port: int = 4317
    # Overload manager: stop accepting requests near the heap cap; bound downstream connections.
    max_heap_bytes: int = 1024 * 1024 * 1024
    max_downstream_connections: int = 10_000


VARIANTS = {
    "local": EnvoySettings(),
    # Both container variants read the descriptor baked into the envoy image (deploy/docker/envoy.Dockerfile).
    "compose": EnvoySettings(listen_address="0.0.0.0", upstream_host="preprocess", cluster_type="STRICT_DNS",
                             descriptor_path="/etc/envoy/descriptor.pb"),
    "k8s": EnvoySettings(listen_address="0.0.0.0", upstream_host="preprocess", cluster_type="STRICT_DNS",
                         descriptor_path="/etc/envoy/descriptor.pb"),
    # An InferencePool pod: the Gateway's endpoint picker already chose this pod, so the upstream is
    # the one preprocess beside Envoy. The Gateway is a proxy in front that appends the client's
    # address to X-Forwarded-For: trusting that one hop keeps per-client admission per client
    # instead of lumping every request under the Gateway's address.
    "pod": EnvoySettings(listen_address="0.0.0.0", upstream_host="127.0.0.1", cluster_type="STATIC",
                         descriptor_path="/etc/envoy/descriptor.pb", xff_num_trusted_hops=1),
}
# Rendered copies that deployments use directly (regenerate with `python -m deploy.envoy.render
# --write-committed`; tests/unit/deploy fails if they drift from the template).
COMMITTED = {"compose": HERE / "envoy.compose.yaml", "k8s": ROOT / "deploy" / "k8s" / "envoy-config.yaml",
             "pod": ROOT / "deploy" / "k8s" / "inference-pool" / "envoy-config.yaml"}


# HTTP status of an Envoy local reply → the gRPC code a transcoded error with that status carries,
# so both error sources share one shape: for a status services/common/errors.py HTTP_STATUS maps
# codes to, its first code (INTERNAL for 500, which UNKNOWN and DATA_LOSS share too); for the
# statuses only Envoy's own replies carry, the code that means the same.
ENVOY_ONLY_STATUS_CODES = {405: Code.UNIMPLEMENTED, 408: Code.DEADLINE_EXCEEDED, 413: Code.RESOURCE_EXHAUSTED,
                           415: Code.INVALID_ARGUMENT, 431: Code.RESOURCE_EXHAUSTED, 502: Code.UNAVAILABLE}


def local_reply_grpc_codes() -> dict[int, int]:
    codes: dict[int, Code] = {}
    for code, status in HTTP_STATUS.items():
        if status >= 400:
            codes.setdefault(status, code)
    codes.update({500: Code.INTERNAL, **ENVOY_ONLY_STATUS_CODES})
    return {status: int(code) for status, code in sorted(codes.items())}


# Reasons for the local replies whose Envoy detail says nothing to a client ("direct_response",
# "lua_response", "early_grpc_json_transcode_failure{NOT_FOUND}", "http1.too_many_headers").
# Every local 404 is an unknown route: the routes forward every known path.
LOCAL_REPLY_REASONS = {404: "UNKNOWN_ROUTE", 405: "METHOD_NOT_ALLOWED", 415: "UNSUPPORTED_MEDIA_TYPE",
                       431: "REQUEST_HEADERS_TOO_LARGE"}
# Envoy's own 503 (no healthy upstream: every replica starting, draining or stalled) is retryable:
# it tells HTTP clients when, as preprocess's RetryInfo does (Retry-After, seconds).
LOCAL_RETRY_AFTER_S = 1
# Messages that replace Envoy's own: OpenAI's wording for an unknown path, with the method.
LOCAL_REPLY_MESSAGES = {404: "Invalid URL (%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH):200%)"}


def api_key_client(key: str) -> str:
    """The name Envoy gives a key's requests in x-mstar-client: stable whatever the order or number
    of keys (the principal owns stored responses, so a renumbered key list must not hand them to
    another key), and it says nothing about the key (64 bits of its SHA-256)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _error_body(code: int, reason: str = "%RESPONSE_CODE_DETAILS%", message: str = "%LOCAL_REPLY_BODY%") -> dict:
    return {"json_format": {
        "code": code,
        "message": message,
        "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": "envoy"}],
    }}


def _status_is(op: str, status: int) -> dict:
    return {"status_code_filter": {"comparison": {
        "op": op, "value": {"default_value": status, "runtime_key": "mstar.local_reply.status"}}}}


def local_reply_config() -> dict:
    """JSON for every local reply: GET /health gets {"status": ...}, errors the google.rpc.Status
    shape; a gRPC request's reply keeps its message as plain text (it becomes grpc-message)."""
    health = {"header_filter": {"header": {"name": ":path", "string_match": {"exact": "/health"}}}}
    # A gRPC client's request (the transcoder also turns HTTP/JSON requests into application/grpc,
    # but marks them with x-envoy-original-path).
    grpc = {"and_filter": {"filters": [
        {"header_filter": {"header": {"name": "content-type",  # not application/grpc-web
                                      "string_match": {"safe_regex": {"regex": "application/grpc([+;].*)?"}}}}},
        {"header_filter": {"header": {"name": "x-envoy-original-path", "present_match": True,
                                      "invert_match": True}}},
    ]}}
    mappers: list[dict] = [
        {"filter": grpc, "body_format_override": {"text_format_source": {"inline_string": "%LOCAL_REPLY_BODY%"}}},
        {"filter": {"and_filter": {"filters": [health, _status_is("LE", 299)]}},
         "body_format_override": {"json_format": {"status": "SERVING"}}},
        {"filter": health, "body_format_override": {"json_format": {"status": "NOT_SERVING"}}},
    ]
    mappers += [{"filter": _status_is("EQ", status),
                 "body_format_override": _error_body(
                     code, LOCAL_REPLY_REASONS.get(status, "%RESPONSE_CODE_DETAILS%"),
                     LOCAL_REPLY_MESSAGES.get(status, "%LOCAL_REPLY_BODY%")),
                 **({"headers_to_add": [{"header": {"key": "retry-after", "value": str(LOCAL_RETRY_AFTER_S)}}]}
                    if status == 503 else {})}
                for status, code in local_reply_grpc_codes().items()]
    return {"mappers": mappers, "body_format": _error_body(2)}


def security_filters(settings: EnvoySettings) -> list[dict]:
    """The optional API-key and rate-limit filters (an empty list when both are off)."""
    filters: list[dict] = []
    if settings.api_keys:
        filters.append({"name": "envoy.filters.http.api_key_auth", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.api_key_auth.v3.ApiKeyAuth",
            "credentials": [{"key": key, "client": api_key_client(key)} for key in dict.fromkeys(settings.api_keys)],
            "key_sources": [{"header": "authorization"}, {"header": "x-api-key"}],
            # The key never reaches preprocess; the upstream learns only which client it was.
            "forwarding": {"header": "x-mstar-client", "hide_credentials": True},
        }})
    if settings.rate_limit_rps > 0:
        everyone = {"default_value": {"numerator": 100, "denominator": "HUNDRED"}}
        filters.append({"name": "envoy.filters.http.local_ratelimit", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "public_rate_limit",
            "token_bucket": {"max_tokens": settings.rate_limit_rps, "tokens_per_fill": settings.rate_limit_rps,
                             "fill_interval": "1s"},
            "filter_enabled": everyone, "filter_enforced": everyone,
        }})
    return filters


def overload_manager(settings: EnvoySettings) -> dict:
    heap = "envoy.resource_monitors.fixed_heap"
    return {
        "refresh_interval": "0.25s",
        "resource_monitors": [
            {"name": heap, "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig",
                "max_heap_size_bytes": settings.max_heap_bytes}},
            {"name": "envoy.resource_monitors.global_downstream_max_connections", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3."
                         "DownstreamConnectionsConfig",
                "max_active_downstream_connections": settings.max_downstream_connections}},
        ],
        "actions": [
            {"name": "envoy.overload_actions.shrink_heap", "triggers": [{"name": heap, "threshold": {"value": 0.90}}]},
            {"name": "envoy.overload_actions.stop_accepting_requests",
             "triggers": [{"name": heap, "threshold": {"value": 0.98}}]},
        ],
    }


def tracing(settings: EnvoySettings) -> tuple[str, str]:
    """Envoy's OpenTelemetry tracer and the cluster of its collector, when one is configured.

    With a collector, Envoy starts (or continues, from a client's traceparent) the trace of every
    request, sends W3C trace context upstream and prints the trace id in its access log. Without
    one there is no tracer at all (Envoy's OpenTelemetry tracer refuses to run without an
    exporter): a client's traceparent passes through as any header, preprocess starts the trace
    otherwise, and the access log and the services' logs join on x-request-id."""
    if not settings.otlp_host:
        return "", ""
    config = {"@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig", "service_name": "envoy",
              "grpc_service": {"envoy_grpc": {"cluster_name": "otlp_collector"}, "timeout": "1s"}}
    hcm_tracing = "          tracing: " + json.dumps({"provider": {"name": "envoy.tracers.opentelemetry",
                                                                  "typed_config": config}}) + "\n"
    address = {"socket_address": {"address": settings.otlp_host, "port_value": settings.otlp_port}}
    cluster = "\n  - " + json.dumps({
        "name": "otlp_collector", "type": "STRICT_DNS", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "otlp_collector",
                            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
    })
    return hcm_tracing, cluster


def hygiene_lua(settings: EnvoySettings) -> str:
    """request_hygiene.lua with its limits: the header cap and the request id bounds the contract
    declares (ClientAppend.request_id: the characters of its pattern, at most max_len of them)."""
    from mstar.v1 import messages_pb2

    from services.common.contract import bounds

    declared = bounds(messages_pb2.ClientAppend, "request_id")
    charset = declared.pattern.removeprefix("^[").removesuffix("]*$")
    lua_class = "".join(
        c if c.isalnum() or (c == "-" and 0 < i < len(charset) - 1 and charset[i - 1].isalnum()
                             and charset[i + 1].isalnum()) else "%" + c
        for i, c in enumerate(charset))  # a Lua character class: escape all but letters, digits, ranges
    head = (f"local MAX_HEADER_BYTES = {settings.max_request_headers_kb * 1024}\n"
            f"local MAX_HEADER_COUNT = {settings.max_request_headers_count}\n"
            f"local MAX_ID_CHARS = {declared.max_len}\n"
            f'local ID_PATTERN = "^[{lua_class}]+$"\n')
    return head + HYGIENE_LUA.read_text("utf-8")


def lb_endpoints(settings: EnvoySettings) -> list[dict]:
    ports = settings.upstream_ports or (settings.upstream_port,)
    return [{"endpoint": {"address": {"socket_address": {"address": settings.upstream_host, "port_value": port}}}}
            for port in ports]


def codec_max_request_headers_count(settings: EnvoySettings) -> int:
    """The codec's header count limit: as many fields as fit in its byte limit under RFC 7541
    accounting (32 bytes a field at least), so that the codec never resets an HTTP/2 stream (no
    response at all) for a count the policy answers with a 431 (request_hygiene.lua)."""
    return max(settings.max_request_headers_count, settings.codec_max_request_headers_kb * 1024 // 32)


def render(settings: EnvoySettings) -> str:
    if settings.codec_max_request_headers_kb < max(settings.max_request_headers_kb, 64):
        raise ValueError("codec_max_request_headers_kb must be >= max_request_headers_kb and >= 64")
    values = {k: str(v) for k, v in asdict(settings).items()}
    values["codec_max_request_headers_count"] = str(codec_max_request_headers_count(settings))
    values["request_hygiene_lua"] = json.dumps(hygiene_lua(settings))
    values["lb_endpoints"] = json.dumps(lb_endpoints(settings))
    values["security_filters"] = "".join(f"\n          - {json.dumps(f)}" for f in security_filters(settings))
    # With keys on, api_key_auth overwrites x-mstar-client (removing it at the route would remove
    # the filter's too: route header removal runs after the filters).
    keep_client = settings.api_keys or settings.trust_client_identity
    values["client_header_removal"] = "" if keep_client else "\n              request_headers_to_remove: [x-mstar-client]"
    values["overload_manager"] = json.dumps(overload_manager(settings))
    values["tracing"], values["otlp_cluster"] = tracing(settings)
    # JSON is valid YAML flow syntax, so generated blocks drop into the template as one line.
    values["local_reply_config"] = json.dumps(local_reply_config())
    # A JSON string literal is a valid YAML double-quoted scalar: embeds the Lua source verbatim,
    # once per API error shape, its tables rendered from the surface that owns the shape.
    for shape in api_errors.SHAPES:
        values[f"{shape}_errors_lua"] = json.dumps(api_errors.lua_source(shape))
    return string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(values)


def write(settings: EnvoySettings, out: Path) -> Path:
    """Write the config; with API keys in it, readable by its owner only (from its creation on)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    text = render(settings)
    mode = 0o600 if settings.api_keys else 0o644
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # an existing file keeps its old mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="local")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--write-committed", action="store_true", help="rewrite the compose, k8s and pod copies")
    parser.add_argument("--http-port", type=int)
    parser.add_argument("--admin-port", type=int)
    parser.add_argument("--upstream-host")
    parser.add_argument("--upstream-port", type=int, action="append",
                        help="preprocess port (repeat for several replicas on --upstream-host)")
    parser.add_argument("--descriptor")
    parser.add_argument("--api-key", action="append", default=[], help="enable API-key auth (repeatable)")
    parser.add_argument("--api-keys-file", type=Path,
                        help="enable API-key auth with these keys: one a line, # comments (keeps them off argv)")
    parser.add_argument("--trust-client-identity", action="store_true",
                        help="keys off: pass x-mstar-client from an authenticating proxy in front of Envoy")
    parser.add_argument("--rate-limit-rps", type=int, help="enable local rate limiting")
    parser.add_argument("--otlp", metavar="HOST:PORT", help="export Envoy's spans to this OTLP/gRPC collector")
    parser.add_argument("--xff-num-trusted-hops", type=int, help="proxies in front of Envoy (client address)")
    args = parser.parse_args(argv)
    if args.write_committed:
        for variant, path in COMMITTED.items():
            print(write(VARIANTS[variant], path))
        return
    if args.out is None:
        parser.error("--out is required")
    if args.api_keys_file:
        from services.stack import api_keys  # the launcher's own parsing (its package imports this one)

        try:
            args.api_key += api_keys.from_file(args.api_keys_file)
        except api_keys.BadApiKeys as exc:
            parser.error(str(exc))
    overrides = {
        "http_port": args.http_port, "admin_port": args.admin_port, "upstream_host": args.upstream_host,
        "upstream_port": args.upstream_port[0] if args.upstream_port else None,
        "upstream_ports": tuple(args.upstream_port) if args.upstream_port and len(args.upstream_port) > 1 else None,
        "descriptor_path": args.descriptor,
        "api_keys": tuple(args.api_key) or None, "rate_limit_rps": args.rate_limit_rps,
        "trust_client_identity": args.trust_client_identity or None,
        "xff_num_trusted_hops": args.xff_num_trusted_hops,
    }
    if args.otlp:
        host, _, port = args.otlp.rpartition(":")
        overrides.update(otlp_host=host, otlp_port=int(port))
    settings = replace(VARIANTS[args.variant], **{k: v for k, v in overrides.items() if v is not None})
    print(write(settings, args.out))


if __name__ == "__main__":
    main()
