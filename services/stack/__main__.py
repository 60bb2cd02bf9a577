"""`make run`: start generation + preprocess + Envoy, wait until ready, keep them running (a child
that exits is restarted with backoff and the restart is printed), stop all on Ctrl-C/SIGTERM.

Ports and model: flags, else MSTAR_HTTP_PORT / MSTAR_ADMIN_PORT / MSTAR_PREPROCESS_PORT /
MSTAR_GENERATION_PORT / MSTAR_GENERATION_METRICS_PORT / MSTAR_PREPROCESS_METRICS_PORT / MSTAR_MODEL,
else 8080 / 9901 / 50051 / 50052 / 9101 / 9102 / default. MSTAR_DEFAULT_MAX_TOKENS sets the
max_tokens of requests that give none (default: whatever fits in the context); MSTAR_OTLP_ENDPOINT
(HOST:PORT) exports OpenTelemetry spans of all three to that collector (default: none).
Replicas: --generation-replicas / --preprocess-replicas, else MSTAR_GENERATION_REPLICAS /
MSTAR_PREPROCESS_REPLICAS, else 1; replica i of a service listens on its base port + 2·i (its
metrics port too). API keys: MSTAR_API_KEYS (comma-separated) and/or --api-keys-file, else
MSTAR_API_KEYS_FILE (one key per line, `#` comments): Envoy then answers 401 without one of them
(Authorization: Bearer KEY or x-api-key: KEY), except GET /health; default: no keys, open.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from services.common.data_dir import default_data_dir
from services.stack import api_keys
from services.stack.readiness import NotReady
from services.stack.stack import Stack, StackConfig
from services.stack.supervisor import Supervisor


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.stack", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="'default' (the embedded SmolLM2), a .gguf file or a HF directory")
    p.add_argument("--http-port", type=int)
    p.add_argument("--admin-port", type=int)
    p.add_argument("--preprocess-port", type=int)
    p.add_argument("--generation-port", type=int)
    p.add_argument("--generation-metrics-port", type=int)
    p.add_argument("--preprocess-metrics-port", type=int)
    p.add_argument("--otlp-endpoint", metavar="HOST:PORT",
                   help="export OpenTelemetry spans of Envoy and both services to this OTLP/gRPC collector "
                        "(env MSTAR_OTLP_ENDPOINT); default: none exported")
    p.add_argument("--default-max-tokens", type=int,
                   help="max_tokens of a request that sets none (env MSTAR_DEFAULT_MAX_TOKENS); default: what fits")
    p.add_argument("--generation-replicas", type=int, help="generation processes (env MSTAR_GENERATION_REPLICAS)")
    p.add_argument("--preprocess-replicas", type=int, help="preprocess processes (env MSTAR_PREPROCESS_REPLICAS)")
    p.add_argument("--null-engine", action="store_true", help="generation without a model (plumbing tests)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"],
                   help="generation --dtype (env MSTAR_DTYPE); auto: bf16 on CUDA and on CPUs with native bf16, else fp32")
    p.add_argument("--quantization", choices=["auto", "gguf", "none"],
                   help="generation --quantization (env MSTAR_QUANTIZATION); auto: a GGUF's own block codes; "
                        "--dtype float32 --quantization none: the exact HF oracle")
    p.add_argument("--log-dir", type=Path, help="where the three logs go (default: a temp dir)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="preprocess state, e.g. stored /v1/responses (env MSTAR_DATA_DIR; default "
                        "~/.local/share/mstar)")
    p.add_argument("--api-keys-file", type=Path,
                   help="require one of these API keys: one a line, # comments (env MSTAR_API_KEYS_FILE; "
                        "MSTAR_API_KEYS adds comma-separated ones); default: no keys")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    return p.parse_args(argv)


def banner(stack: Stack) -> str:
    t = stack.timings_s
    url = stack.http_url
    metrics_lines = "\n                     ".join(f"{url}  ({name})" for name, url in stack.metrics_urls.items())
    keys = len(stack.config.api_keys)
    health_note = "   (no key needed)" if keys else ""
    keys_line = (f"{keys} (Authorization: Bearer KEY or x-api-key: KEY)" if keys
                 else "off (MSTAR_API_KEYS or --api-keys-file turns them on)")
    auth = " -H 'Authorization: Bearer KEY'" if keys else ""
    return f"""
mstar is ready in {t['ready']:.1f} s (generation {t['generation']:.1f} s, preprocess {t['preprocess']:.1f} s,
first request through Envoy {t['first_request'] - t['envoy_upstream']:.2f} s)

  HTTP/JSON + gRPC   {url}   (grpcurl -plaintext {stack.grpc_target} list)
  OpenAI base_url    {url}/v1   (chat/completions, completions, responses, models)
  Anthropic base_url {url}   (messages)
  health             {url}/health{health_note}
  API keys           {keys_line}
  Envoy admin        {stack.admin_url}   (127.0.0.1 only)
  preprocess gRPC    {", ".join(stack.preprocess_targets)}
  generation gRPC    {", ".join(stack.generation_targets)}
  metrics            {metrics_lines}
  logs               {stack.log_dir}

  curl -N {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\
    -d '{{"model": "default", "stream": true, "max_tokens": 32,
         "messages": [{{"role": "user", "content": "Say hello in French."}}]}}'

A service that exits is restarted (printed here). Ctrl-C stops them all.
"""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        keys = api_keys.configured(os.environ, args.api_keys_file)
    except api_keys.BadApiKeys as exc:
        print(f"mstar: {exc}", file=sys.stderr, flush=True)
        return 2
    config = StackConfig.from_env(
        model=args.model, http_port=args.http_port, admin_port=args.admin_port,
        preprocess_port=args.preprocess_port, generation_port=args.generation_port,
        generation_metrics_port=args.generation_metrics_port, preprocess_metrics_port=args.preprocess_metrics_port,
        default_max_tokens=args.default_max_tokens, otlp_endpoint=args.otlp_endpoint,
        generation_replicas=args.generation_replicas, preprocess_replicas=args.preprocess_replicas,
        log_dir=args.log_dir, data_dir=args.data_dir or default_data_dir(), ready_timeout_s=args.ready_timeout,
        null_engine=args.null_engine or None,
        dtype=args.dtype, quantization=args.quantization, api_keys=keys or None)

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the stack exactly like Ctrl-C

    signal.signal(signal.SIGTERM, on_signal)
    stack = Stack(config)
    print(f"starting mstar (model {config.model}); logs in {stack.log_dir}", flush=True)
    try:
        stack.start()
        print(banner(stack), flush=True)
        supervisor = Supervisor(stack, report=lambda message: print(
            f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True))
        while True:
            supervisor.poll()
            time.sleep(0.25)
    except NotReady as exc:
        print(f"mstar did not become ready: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("\nstopping (Envoy, preprocess, generation) ...", flush=True)
        return 0
    finally:
        # Ignore further Ctrl-C while children drain, so a double press cannot leave orphans.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        codes = stack.stop()
        if codes:
            print("stopped: " + ", ".join(f"{k} exit {v}" for k, v in codes.items()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
