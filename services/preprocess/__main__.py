"""`python -m services.preprocess --model default|PATH --generation HOST:PORT[,...] --port N`.

Loads the tokenizer and template (no weights), keeps one multiplexed stream to every generation
replica and routes each request to one of them (docs/design.md, "Scale-out"), and serves
mstar.v1.InferenceService with health (SERVING while any generation replica is), reflection and
graceful SIGTERM. Logs the bound port (port 0 picks a free one).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
from pathlib import Path

from mstar.v1 import inference_service_pb2_grpc as api_grpc

from services.common import tracing
from services.common.data_dir import default_data_dir
from services.common.env_flags import parse_with_env
from services.common.logs import setup_logging
from services.common.metrics import PreprocessMetrics, start_metrics_server
from services.common.server import GrpcServer
from services.preprocess.admission import Admission, AdmissionLimits
from services.preprocess.limits import Limits
from services.preprocess.media import FileReader
from services.preprocess.model import load_model
from services.preprocess.peers import Peers
from services.preprocess.replica_metrics import ReplicaMetrics
from services.preprocess.replica_pool import PoolConfig, ReplicaPool
from services.preprocess.request_run import Deps
from services.preprocess.resolver import Resolver, address
from services.preprocess.routing import RoutingConfig
from services.preprocess.servicer import InferenceServicer
from services.preprocess.surfaces.responses.store import ResponseStore

log = logging.getLogger("services.preprocess")
ENV_PREFIX = "MSTAR_PREPROCESS_"  # --file-root is MSTAR_PREPROCESS_FILE_ROOT (services/common/env_flags.py)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.preprocess", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default", help="'default', a .gguf file or a HF tokenizer directory")
    p.add_argument("--generation", default="127.0.0.1:50052",
                   help="generation replicas: HOST:PORT[,HOST:PORT...]; a DNS name stands for every address it "
                        "resolves to (e.g. a Kubernetes headless Service)")
    p.add_argument("--generation-resolve-s", type=float, default=5.0, help="re-resolve --generation this often")
    p.add_argument("--routing-block-size", type=int, default=16,
                   help="tokens per KV block for prefix affinity; = the generation service's --block-size")
    p.add_argument("--routing-affinity-blocks", type=int, default=4,
                   help="full blocks hashed into a prompt's affinity key (rendezvous hashing)")
    p.add_argument("--routing-load-margin", type=float, default=8.0,
                   help="requests a prompt's preferred replica may carry above the least-loaded one")
    p.add_argument("--routing-kv-weight", type=float, default=8.0, help="a full KV cache counts as this many requests")
    p.add_argument("--prefix-index", action=argparse.BooleanOptionalAction, default=True,
                   help="route a prompt to where this preprocess sent its longest known prefix (else rendezvous only)")
    p.add_argument("--failover-attempts", type=int, default=3,
                   help="replicas one request may be tried on (a request lost before its first token moves)")
    p.add_argument("--peers", default="",
                   help="every preprocess replica (same syntax as --generation; this one is skipped): "
                        "Append/Cancel for a request another replica runs are forwarded there")
    p.add_argument("--advertise", default=None,
                   help="HOST:PORT the peers know this replica by (default: this host's address and --port)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051, help="0 picks a free port (logged)")
    p.add_argument("--max-requests", type=int, default=AdmissionLimits.max_requests, help="admission: requests in flight")
    p.add_argument(
        "--max-prompt-tokens", type=int, default=AdmissionLimits.max_prompt_tokens, help="admission: prompt tokens in flight"
    )
    p.add_argument("--max-requests-per-client", type=int, default=None,
                   help="admission: requests in flight of one client (API key, else client address); "
                        "default 3/4 of --max-requests")
    p.add_argument("--max-open-inputs", type=int, default=None,
                   help="admission: requests whose input is open; default 1/2 of --max-requests")
    p.add_argument("--max-open-inputs-per-client", type=int, default=None,
                   help="admission: requests whose input is open, per client; default 1/4 of --max-requests")
    p.add_argument("--max-tokens-cap", type=int, default=Limits.max_tokens_cap, help="largest max_tokens accepted")
    p.add_argument("--default-max-tokens", type=int, default=None,
                   help="max_tokens of a request that sets none (default: whatever fits in the context)")
    p.add_argument("--max-input-bytes", type=int, default=Limits.max_input_bytes, help="input bytes per stream")
    p.add_argument("--max-appends", type=int, default=Limits.max_appends, help="appends per stream")
    p.add_argument("--file-root", type=Path, default=None, help="allow file_path inputs under this directory")
    p.add_argument("--max-file-bytes", type=int, default=Limits.max_file_bytes)
    p.add_argument("--keepalive-s", type=float, default=2.0, help="KeepAlive period while waiting")
    p.add_argument("--input-idle-s", type=float, default=60.0,
                   help="fail a request whose open input receives nothing for this long")
    p.add_argument("--input-lifetime-s", type=float, default=300.0,
                   help="fail a request whose input is still open this long after it started, however "
                        "often it appends")
    p.add_argument("--grace-s", type=float, default=20.0, help="SIGTERM drain period")
    p.add_argument("--backend-stall-s", type=float, default=5.0,
                   help="a generation replica's stream silent this long (no heartbeat) is stalled: it takes "
                        "no new requests; those it runs move to another replica (no token yet) or wait for it")
    p.add_argument("--backend-dead-s", type=float, default=60.0,
                   help="a generation replica's stream silent this long is given up like a broken one: its "
                        "requests move (no token yet) or fail with UNAVAILABLE, and it reconnects")
    p.add_argument("--drain-accept-s", type=float, default=2.0,
                   help="after SIGTERM, keep taking new requests this long (health already NOT_SERVING) so a "
                        "load balancer stops sending before they are refused; Envoy needs 2 health checks")
    p.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="where state lives (env MSTAR_DATA_DIR, else ~/.local/share/mstar)")
    p.add_argument("--responses-db", type=Path, default=None,
                   help="SQLite file of stored /v1/responses (default: <data-dir>/responses.sqlite3); replicas "
                        "on one host share it, so a stored response is found whichever replica Envoy picks")
    p.add_argument("--responses-ttl-s", type=float, default=30 * 24 * 3600.0, help="stored responses expire")
    p.add_argument("--responses-max-bytes", type=int, default=256 * 1024 * 1024,
                   help="stored responses beyond this size: the oldest go first")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics here (0 = any); off if unset")
    p.add_argument("--otlp-endpoint", default=None,
                   help="export OpenTelemetry spans (OTLP/gRPC) here; default OTEL_EXPORTER_OTLP_ENDPOINT, else none")
    p.add_argument("--log-level", default="INFO")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parse_with_env(build_parser(), ENV_PREFIX, argv)  # every flag also as MSTAR_PREPROCESS_<FLAG>


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
    replica_metrics = ReplicaMetrics(metrics.registry, metrics.conductor)
    # Health follows the generation replicas: the dependency "generation" is down until one serves.
    pool = ReplicaPool(
        Resolver(args.generation), pool_config(args), state=server.state,
        on_status=lambda replica, status: metrics.on_conductor_status(status, replica),
        events=replica_metrics,
    )
    replica_metrics.watch(pool)
    admission = Admission(AdmissionLimits.sized(
        args.max_requests, args.max_prompt_tokens, max_requests_per_client=args.max_requests_per_client,
        max_open_inputs=args.max_open_inputs, max_open_inputs_per_client=args.max_open_inputs_per_client))
    metrics.watch_admission(admission)
    deps = Deps(
        model=model,
        backend=pool,
        admission=admission,
        limits=limits,
        files=FileReader(args.file_root, args.max_file_bytes),
        keepalive_s=args.keepalive_s,
        input_idle_s=args.input_idle_s,
        input_lifetime_s=args.input_lifetime_s,
    )
    store = ResponseStore(args.responses_db or args.data_dir / "responses.sqlite3", args.responses_ttl_s,
                          args.responses_max_bytes)
    await store.open()  # a bad path fails at startup, not at the first request
    servicer = InferenceServicer(deps, server.state, metrics, store)
    server.add(api_grpc.add_InferenceServiceServicer_to_server, servicer, "mstar.v1.InferenceService")
    port = await server.start()
    servicer.peers = Peers(Resolver(args.peers) if args.peers else None, args.advertise or advertised(args.host, port),
                           resolve_interval_s=args.generation_resolve_s)
    servicer.peers.start()
    # Responses this replica left running when it stopped failed with it (not other replicas').
    await store.recover(servicer.peers.advertise)
    server.state.serve()
    pool.start()
    log.info("preprocess ready", extra={"port": port, "model": model.name, "generation": args.generation,
                                        "advertise": servicer.peers.advertise})
    print(f"preprocess listening on port {port}", flush=True)

    async def on_drain(grace_s: float) -> None:
        await servicer.drain(grace_s, args.drain_accept_s)
        await pool.close()
        await servicer.peers.close()
        await store.close()

    await server.wait_for_shutdown(args.grace_s, on_drain=on_drain)
    tracing.shutdown()


def pool_config(args: argparse.Namespace) -> PoolConfig:
    routing = RoutingConfig(block_size=args.routing_block_size, affinity_blocks=args.routing_affinity_blocks,
                            load_margin=args.routing_load_margin, kv_weight=args.routing_kv_weight)
    return PoolConfig(routing=routing, prefix_index=args.prefix_index, resolve_interval_s=args.generation_resolve_s,
                      max_attempts=args.failover_attempts, stall_s=args.backend_stall_s,
                      dead_s=args.backend_dead_s)


def advertised(host: str, port: int) -> str:
    """This replica's address as its peers resolve it: the bound host, or for a wildcard bind the
    address this host's name resolves to (a pod's or container's IP)."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostbyname(socket.gethostname())
    return address(host, port)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup_logging("services.preprocess", args.log_level)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
