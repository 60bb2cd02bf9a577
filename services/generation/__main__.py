"""`python -m services.generation --model default|FILE.gguf|HF_DIR --port N` (port 0 = any free port).

Starts gRPC at once (health NOT_SERVING), loads and warms the model, then reports SERVING. On
SIGTERM: NOT_SERVING, stop admitting, let running requests finish for --grace-s, fail the rest with
UNAVAILABLE, end the streams, exit 0. When the engine FAILS (a step raised, or the watchdog saw no
progress for --watchdog-s with work pending): every request fails with UNAVAILABLE at once, health
turns NOT_SERVING, and after --failed-exit-s the process exits with status 3 so whatever supervises
it (`make run`, compose, Kubernetes) starts a fresh one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time

from mstar.generation.v1 import generation_service_pb2_grpc as gen_grpc

from services.common import errors, tracing
from services.common.env_flags import parse_with_env
from services.common.logs import setup_logging
from services.common.metrics import GenerationMetrics, start_metrics_server
from services.common.server import INTERNAL_MAX_MESSAGE_BYTES, GrpcServer
from services.common.serving import State
from services.generation import heap
from services.generation.engine import Engine, EngineConfig, SamplingParams
from services.generation.faults import attach_boundaries, install_from_env
from services.generation.servicer import GenerationServicer
from services.generation.speculation import MODES as SPECULATION_MODES
from services.generation.speculation import SpeculationConfig
from services.generation.step_choice import MODES, STEP_ENV
from services.generation.torch_thread import TorchThread
from services.generation.watchdog import DEFAULT_TIMEOUT_S, watch_engine

log = logging.getLogger("services.generation")

EXIT_FAILED = 3  # the engine failed: restart me
ENV_PREFIX = "MSTAR_GENERATION_"  # --kv-blocks is MSTAR_GENERATION_KV_BLOCKS (services/common/env_flags.py)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.generation", description=__doc__)
    p.add_argument("--model", default="default", help="'default' (embedded SmolLM2 GGUF), a .gguf file or an HF dir")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=50052, help="0 = any free port (printed)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads on CPU; default: the usable CPUs (affinity, cgroup quota) minus a reserve "
                        "for Envoy and preprocess (services/generation/threads.py)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="activations; auto: bf16 on CUDA and on CPUs with native bf16, else fp32 "
                        "(services/generation/numerics.py)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="the KV cache's dtype; auto: bf16 when serving a GGUF's codes (as llama.cpp's f16 cache), "
                        "else the activations'")
    p.add_argument("--quantization", default="auto", choices=["auto", "gguf", "none"],
                   help="auto/gguf: serve a GGUF's block-quantized weights as the file's codes (CPU); none: dense. "
                        "--dtype float32 --quantization none is the exact HF oracle")
    p.add_argument("--kernels", default="auto", choices=["auto", "cpu", "reference"],
                   help="CPU ops: cpu (compiled C++, kernels/cpu) or reference (plain torch, the oracle)")
    p.add_argument("--step", default=os.environ.get(STEP_ENV, "auto"), choices=MODES,
                   help=f"how a step runs (default ${STEP_ENV}, else auto; services/generation/step_choice.py): "
                        "auto: a GGUF's codes on CPU as one C++ call (fused), other models on CPU as one Inductor "
                        "graph built at warm-up (graph), CUDA graphs on CUDA, the reference kernels eager; "
                        "eager: op by op (debugging; the test suite's); graph, fused: that step or a start-up error")
    p.add_argument("--embedding-pooling", default="mean", choices=["mean", "last"],
                   help="how embedding requests pool the final hidden states of their prompt (docs/design.md)")
    p.add_argument("--speculative", default="auto", choices=list(SPECULATION_MODES),
                   help="speculative decoding: ngram (prompt lookup), draft (a --draft-model's greedy tokens), off, "
                        "or auto: draft with a --draft-model, else ngram where a verify row computes a decode "
                        "row's bits (the CPU kernels on block codes), off elsewhere")
    p.add_argument("--draft-model", default=None,
                   help="a smaller model with the target's tokenizer (as --model names one) proposing the tokens "
                        "verify steps check (services/generation/draft.py); its KV pool has --kv-blocks blocks")
    p.add_argument("--speculative-tokens", type=int, default=4, help="the most tokens proposed per sequence and step")
    p.add_argument("--kv-blocks", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-batched-tokens", type=int, default=512)
    p.add_argument("--long-prefill-token-threshold", type=int, default=None,
                   help="prefill fairness: while shorter prompts wait, a long prefill's chunk is capped at this "
                        "many tokens and they get the rest of the step (services/generation/scheduler.py); "
                        "default: half of --max-batched-tokens; 0: first come, first served")
    p.add_argument("--status-interval-ms", type=int, default=0, help="ConductorStatus period; 0 = off")
    p.add_argument("--max-message-bytes", type=int, default=INTERNAL_MAX_MESSAGE_BYTES,
                   help="the Stream's message limit (its start frames carry image tiles)")
    p.add_argument("--grace-s", type=float, default=10.0, help="drain period on SIGTERM")
    p.add_argument("--null-engine", action="store_true", help="no model: fixed fake tokens (transport benchmarks)")
    p.add_argument("--null-step-ms", type=float, default=0.0, help="step time of the null engine")
    p.add_argument("--watchdog-s", type=float, default=DEFAULT_TIMEOUT_S,
                   help="fail all and go NOT_SERVING if the engine makes no progress this long with work pending")
    p.add_argument("--failed-exit-s", type=float, default=2.0,
                   help="exit (status 3) this long after the engine failed, for a supervisor to restart; "
                        "0 = stay up, NOT_SERVING")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics here (0 = any); off if unset")
    p.add_argument("--otlp-endpoint", default=None,
                   help="export OpenTelemetry spans (OTLP/gRPC) here; default OTEL_EXPORTER_OTLP_ENDPOINT, else none")
    p.add_argument("--log-level", default="INFO")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = parse_with_env(p, ENV_PREFIX, argv)  # every flag also as MSTAR_GENERATION_<FLAG>
    if args.step not in MODES:  # argparse checks choices only on the command line, not the env default
        p.error(f"${STEP_ENV} must be one of {', '.join(MODES)}; got {args.step!r}")
    if args.draft_model is not None and args.speculative == "auto":
        args.speculative = "draft"
    if args.draft_model is not None and args.null_engine:
        p.error("--draft-model needs a model: not with --null-engine")
    if (args.speculative == "draft") != (args.draft_model is not None):
        p.error("--speculative draft and --draft-model go together (a draft model proposes only in draft mode)")
    return args


def _without_triton_on_cpu(device: str) -> None:
    """On CPU, keep triton out of this process: torch's Dynamo imports it whenever it is installed
    (it is, for the kernel tests and CUDA), which costs 77 MB of RSS for GPU code a CPU step never
    runs. A torch without triton is the usual CPU install, so Inductor's CPU path expects it."""
    import torch

    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        sys.modules.setdefault("triton", None)  # `import triton` now raises ImportError


def build_runner(args, model: str | None = None):
    """The runner of --model, or of `model` (the draft model) on the same settings."""
    if args.null_engine:
        from services.generation.null_runner import NullRunner

        return NullRunner(step_time_s=args.null_step_ms / 1000.0)
    _without_triton_on_cpu(args.device)
    from services.generation.model_runner import ModelRunner, RunnerConfig
    from services.generation.weights.locate import load_checkpoint

    t0 = time.monotonic()
    checkpoint = load_checkpoint(model or args.model)
    t1 = time.monotonic()
    config = RunnerConfig(args.kv_blocks, args.block_size, args.device, args.threads, dtype=args.dtype,
                          kv_cache_dtype=args.kv_cache_dtype,
                          quantization=args.quantization, kernels=args.kernels, step=args.step,
                          max_num_seqs=args.max_num_seqs, pooling=args.embedding_pooling)
    runner = ModelRunner(checkpoint, config)
    t2 = time.monotonic()
    runner.warm_up()  # compiled decode graphs: part of readiness
    del checkpoint
    log.info("heap trimmed", extra={"trimmed": heap.trim()})  # the load's decoded copies are freed but still resident (heap.py)
    log.info("model loaded", extra={"load_s": round(t1 - t0, 2), "build_s": round(t2 - t1, 2),
                                    "warm_up_s": round(time.monotonic() - t2, 2)})
    return runner


def warm_up(engine: Engine, timeout_s: float = 120.0) -> None:
    """One tiny greedy request through the whole engine before reporting SERVING; meanwhile the
    grammar compiler gets ready on its own thread (structured output's first request is not slowed)."""
    if engine.grammars.compiler is not None:
        engine.grammars.compiler.warm_up()
    engine.add_request(("warmup", "warmup"), [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=2))
    deadline = time.monotonic() + timeout_s
    while engine.num_unfinished or not engine.num_steps:
        if time.monotonic() > deadline or engine.serving.state is State.FAILED:
            raise RuntimeError("warm-up did not finish")
        time.sleep(0.01)


async def serve(args) -> bool:
    """Serve until stopped; True when the engine failed (the caller exits with EXIT_FAILED)."""
    loop = asyncio.get_running_loop()
    tracing.setup("generation", args.otlp_endpoint)
    server = GrpcServer("generation", args.host, args.port, max_message_bytes=args.max_message_bytes,
                        interceptors=tracing.server_interceptors())
    state = server.state
    servicer = GenerationServicer(state, status_interval_ms=args.status_interval_ms)
    server.add(gen_grpc.add_GenerationServiceServicer_to_server, servicer, "mstar.generation.v1.GenerationService")
    port = await server.start()
    print(f"generation service listening on port {port}", flush=True)
    torch_thread = TorchThread()  # load, compile and step on one thread: one OpenMP pool (torch_thread.py)
    runner = install_from_env(await torch_thread.call(build_runner, args))  # MSTAR_FAULTS: tests only
    draft = await torch_thread.call(build_runner, args, args.draft_model) if args.draft_model else None
    metadata = getattr(runner, "numerics_metadata", None)
    servicer.numerics = metadata() if metadata else json.dumps({"kernels": "null engine"})
    config = EngineConfig(args.kv_blocks, args.block_size, args.max_num_seqs, args.max_batched_tokens,
                          long_prefill_token_threshold=args.long_prefill_token_threshold,
                          speculation=SpeculationConfig(args.speculative, num_tokens=args.speculative_tokens))

    metrics = GenerationMetrics(model_name=args.model)  # vllm:* gauges are labelled as vLLM labels them
    metrics.watch_serving(state)
    if args.metrics_port is not None:
        log.info("metrics", extra={"port": start_metrics_server(args.host, args.metrics_port, metrics.registry)})

    def on_step(out) -> None:  # engine thread: metrics first (thread-safe), then the streams
        try:
            metrics.on_engine_output(out, engine)
        except Exception:  # noqa: BLE001 - a metrics bug must never lose a step's output
            log.exception("metrics failed to record a step; its output is delivered anyway")
        servicer.on_step(out)

    # The warm-up request's key names no stream, so the servicer drops its outputs.
    engine = Engine(runner, config, on_step, state, draft=draft)
    metrics.describe_cache(engine.block_manager.block_size, engine.block_manager.num_blocks)
    attach_boundaries(runner, engine.boundary, servicer.boundary)  # MSTAR_FAULTS request faults: tests only
    servicer.attach(engine, loop)
    engine.start(torch_thread)
    await asyncio.to_thread(warm_up, engine)  # waits on the engine; runs no torch itself
    state.serve()

    def on_stall(stalled_s: float) -> None:  # watchdog thread; the engine thread is stuck
        state.fail("ENGINE_STALLED", f"the engine made no progress for {stalled_s:.0f} s")

    def on_state(s) -> None:  # any thread: a failed engine is not trusted again; let it be restarted
        if s.state is State.FAILED and args.failed_exit_s > 0:
            loop.call_soon_threadsafe(loop.call_later, args.failed_exit_s, server.request_stop)

    state.on_change(on_state)
    watchdog = watch_engine(engine, args.watchdog_s, on_stall)
    log.info("generation ready", extra={"port": port, "model": args.model, "null_engine": args.null_engine})

    async def drain(grace_s: float) -> None:
        if state.state is State.FAILED:
            grace_s = 0.0  # nothing runs any more: every request already failed
        deadline = loop.time() + grace_s
        while engine.num_unfinished and loop.time() < deadline:
            await asyncio.sleep(0.05)
        engine.fail_all(errors.unavailable("the server is shutting down", "SHUTTING_DOWN"))
        while engine.num_unfinished and loop.time() < deadline + 2.0:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)  # let the last frames reach the streams
        servicer.shutdown(errors.unavailable("the server is shutting down", "SHUTTING_DOWN"))

    await server.wait_for_shutdown(args.grace_s, on_drain=drain)
    watchdog.stop()
    engine.stop()
    torch_thread.shutdown()
    tracing.shutdown()
    return state.state is State.FAILED


def main(argv=None) -> None:
    args = parse_args(argv)
    # Compiled decode graphs are cached on disk by Inductor: keep them where a reboot does not
    # wipe them (its default is under /tmp), so a restart loads instead of compiling.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "mstar", "inductor"))
    setup_logging("services.generation", args.log_level)
    if asyncio.run(serve(args)):
        log.error("exiting: the engine failed", extra={"exit_status": EXIT_FAILED})
        logging.shutdown()
        # A hung engine thread may never return: do not wait for it at interpreter exit.
        os._exit(EXIT_FAILED)


if __name__ == "__main__":
    main()
