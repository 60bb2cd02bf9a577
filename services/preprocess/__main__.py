"""`python -m services.preprocess --model default|PATH --generation HOST:PORT --port N`.

Loads the tokenizer and template (no weights), connects the multiplexed stream to the generation
service, and serves mstar.v1.InferenceService with health (following the backend's health),
reflection and graceful SIGTERM. Logs the bound port (port 0 picks a free one).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from mstar.v1 import inference_service_pb2_grpc as api_grpc

from services.common import tracing
from services.common.logs import setup_logging
from services.common.metrics import PreprocessMetrics, start_metrics_server
from services.common.server import GrpcServer
from services.preprocess.admission import Admission, AdmissionLimits
from services.preprocess.backend import GenerationBackend
from services.preprocess.limits import Limits
from services.preprocess.media import FileReader
from services.preprocess.model import load_model
from services.preprocess.request_run import Deps
from services.preprocess.servicer import InferenceServicer

log = logging.getLogger("services.preprocess")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.preprocess", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default", help="'default', a .gguf file or a HF tokenizer directory")
    p.add_argument("--generation", default="127.0.0.1:50052", help="generation service address")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051, help="0 picks a free port (logged)")
    p.add_argument("--max-requests", type=int, default=64, help="admission: requests in flight")
    p.add_argument(
        "--max-prompt-tokens", type=int, default=256 * 1024, help="admission: prompt tokens in flight"
    )
    p.add_argument("--max-requests-per-client", type=int, default=None,
                   help="admission: requests in flight of one client (API key, else client address); "
                        "default 3/4 of --max-requests")
    p.add_argument("--max-open-inputs", type=int, default=None,
                   help="admission: requests whose input is open; default 1/2 of --max-requests")
    p.add_argument("--max-open-inputs-per-client", type=int, default=None,
                   help="admission: requests whose input is open, per client; default 1/4 of --max-requests")
    p.add_argument("--max-tokens-cap", type=int, default=8192, help="largest max_tokens accepted")
    p.add_argument("--default-max-tokens", type=int, default=None,
                   help="max_tokens of a request that sets none (default: whatever fits in the context)")
    p.add_argument("--max-input-bytes", type=int, default=8 * 1024 * 1024, help="input bytes per stream")
    p.add_argument("--max-appends", type=int, default=4096, help="appends per stream")
    p.add_argument("--file-root", type=Path, default=None, help="allow file_path inputs under this directory")
    p.add_argument("--max-file-bytes", type=int, default=4 * 1024 * 1024)
    p.add_argument("--keepalive-s", type=float, default=2.0, help="KeepAlive period while waiting")
    p.add_argument("--input-idle-s", type=float, default=60.0,
                   help="fail a request whose open input receives nothing for this long")
    p.add_argument("--input-lifetime-s", type=float, default=300.0,
                   help="fail a request whose input is still open this long after it started, however "
                        "often it appends")
    p.add_argument("--grace-s", type=float, default=20.0, help="SIGTERM drain period")
    p.add_argument("--backend-stall-s", type=float, default=5.0,
                   help="a generation stream silent this long (no heartbeat) is stalled: its requests fail, "
                        "health NOT_SERVING")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics here (0 = any); off if unset")
    p.add_argument("--otlp-endpoint", default=None,
                   help="export OpenTelemetry spans (OTLP/gRPC) here; default OTEL_EXPORTER_OTLP_ENDPOINT, else none")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    model = load_model(args.model)
    limits = Limits(
        max_tokens_cap=args.max_tokens_cap,
        default_max_tokens=args.default_max_tokens,
        max_input_bytes=args.max_input_bytes,
        max_appends=args.max_appends,
        max_file_bytes=args.max_file_bytes,
    )
    tracing.setup("preprocess", args.otlp_endpoint)
    server = GrpcServer("preprocess", args.host, args.port, interceptors=tracing.server_interceptors())
    metrics = PreprocessMetrics()
    metrics.watch_serving(server.state)
    if args.metrics_port is not None:
        log.info("metrics", extra={"port": start_metrics_server(args.host, args.metrics_port, metrics.registry)})
    # Health follows the backend: the dependency "generation" is down until the stream is up.
    backend = GenerationBackend(args.generation, state=server.state, on_status=metrics.on_conductor_status,
                                stall_s=args.backend_stall_s)
    admission = Admission(AdmissionLimits.sized(
        args.max_requests, args.max_prompt_tokens, max_requests_per_client=args.max_requests_per_client,
        max_open_inputs=args.max_open_inputs, max_open_inputs_per_client=args.max_open_inputs_per_client))
    metrics.watch_admission(admission)
    deps = Deps(
        model=model,
        backend=backend,
        admission=admission,
        limits=limits,
        files=FileReader(args.file_root, args.max_file_bytes),
        keepalive_s=args.keepalive_s,
        input_idle_s=args.input_idle_s,
        input_lifetime_s=args.input_lifetime_s,
    )
    servicer = InferenceServicer(deps, server.state, metrics)
    server.add(api_grpc.add_InferenceServiceServicer_to_server, servicer, "mstar.v1.InferenceService")
    port = await server.start()
    server.state.serve()
    backend.start()
    log.info("preprocess ready", extra={"port": port, "model": model.name, "generation": args.generation})
    print(f"preprocess listening on port {port}", flush=True)

    async def on_drain(grace_s: float) -> None:
        await servicer.drain(grace_s)
        await backend.close()

    await server.wait_for_shutdown(args.grace_s, on_drain=on_drain)
    tracing.shutdown()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup_logging("services.preprocess", args.log_level)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
