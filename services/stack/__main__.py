"""`make run`: start generation + preprocess + Envoy, wait until ready, keep them running (a child
that exits is restarted with backoff and the restart is printed), stop all on Ctrl-C/SIGTERM.

Every flag below is also an environment variable, MSTAR_<FLAG> (services/common/env_flags.py):
--model is MSTAR_MODEL, --http-port MSTAR_HTTP_PORT, --file-root MSTAR_FILE_ROOT ...; a flag on
the command line wins. `make help` lists them. Defaults: ports 8080 (HTTP/JSON + gRPC) / 9901
(Envoy admin) / 50051 (preprocess) / 50052 (generation) / 9102, 9101 (their metrics), the
embedded default model. Replicas: replica i of a service listens on its base port + 2·i (its
metrics port too). API keys: MSTAR_API_KEYS (comma-separated) and/or --api-keys-file (one key per
line, `#` comments): Envoy then answers 401 without one of them (Authorization: Bearer KEY or
x-api-key: KEY), except GET /health; default: no keys, open. Each service's own flags:
MSTAR_GENERATION_<FLAG> / MSTAR_PREPROCESS_<FLAG> (e.g. MSTAR_GENERATION_MAX_NUM_SEQS=8), which
the children read from the environment they inherit (`make settings` lists them all).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from services.common.data_dir import default_data_dir
from services.common.env_flags import parse_with_env
from services.stack import api_keys
from services.stack.readiness import NotReady
from services.stack.stack import Stack, StackConfig
from services.stack.supervisor import Supervisor

ENV_PREFIX = "MSTAR_"  # --http-port is MSTAR_HTTP_PORT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.stack", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="'default' (the embedded SmolLM2), a .gguf file or a HF directory")
    p.add_argument("--http-port", type=int, help="Envoy: HTTP/JSON and gRPC (default 8080)")
    p.add_argument("--admin-port", type=int, help="Envoy's admin, 127.0.0.1 only (default 9901)")
    p.add_argument("--preprocess-port", type=int, help="preprocess gRPC (default 50051)")
    p.add_argument("--generation-port", type=int, help="generation gRPC (default 50052)")
    p.add_argument("--generation-metrics-port", type=int, help="generation Prometheus /metrics (default 9101)")
    p.add_argument("--preprocess-metrics-port", type=int, help="preprocess Prometheus /metrics (default 9102)")
    p.add_argument("--otlp-endpoint", metavar="HOST:PORT",
                   help="export OpenTelemetry spans of Envoy and both services to this OTLP/gRPC collector; "
                        "default: none exported")
    p.add_argument("--default-max-tokens", type=int,
                   help="max_tokens of a request that sets none; default: what fits")
    p.add_argument("--generation-replicas", type=int, help="generation processes")
    p.add_argument("--preprocess-replicas", type=int, help="preprocess processes")
    p.add_argument("--null-engine", action="store_true", help="generation without a model (plumbing tests)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"],
                   help="generation --dtype; auto: bf16 on CUDA and on CPUs with native bf16, else fp32")
    p.add_argument("--quantization", choices=["auto", "gguf", "none"],
                   help="generation --quantization; auto: a GGUF's own block codes; "
                        "--dtype float32 --quantization none: the exact HF oracle")
    p.add_argument("--log-dir", type=Path, help="where the three logs go (default: a temp dir)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="preprocess state, e.g. stored /v1/responses (default "
                        "~/.local/share/mstar)")
    p.add_argument("--api-keys-file", type=Path,
                   help="require one of these API keys: one a line, # comments (MSTAR_API_KEYS adds "
                        "comma-separated ones); default: no keys")
    p.add_argument("--file-root", type=Path,
                   help="inputs may name files (file_path prompt parts) under this directory; default: none")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for all three to be ready")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return parse_with_env(build_parser(), ENV_PREFIX, argv)


def stack_config(args: argparse.Namespace, keys: tuple[str, ...]) -> StackConfig:
    """The flags as a StackConfig; a flag left unset keeps StackConfig's default."""
    given = {name: getattr(args, name) for name in (
        "model", "http_port", "admin_port", "preprocess_port", "generation_port", "generation_metrics_port",
        "preprocess_metrics_port", "default_max_tokens", "otlp_endpoint", "generation_replicas",
        "preprocess_replicas", "log_dir", "dtype", "quantization", "file_root")}
    given |= {"data_dir": args.data_dir or default_data_dir(), "ready_timeout_s": args.ready_timeout,
              "null_engine": args.null_engine or None, "api_keys": keys or None}
    return StackConfig(**{k: v for k, v in given.items() if v is not None})


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

  HTTP/JSON + gRPC   {url}   (make grpcurl ARGS='-plaintext {stack.grpc_target} list')
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
    config = stack_config(args, keys)

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
