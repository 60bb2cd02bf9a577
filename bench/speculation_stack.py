"""bench/speculation.py's rows through the stack: `make run`'s three processes, native gRPC
`GenerateStream` through Envoy, each workload with `speculative: false` against unset (the
generation service's policy, which speculates there), on one stack, the two taking turns round by
round. Outputs must be identical (the bench fails otherwise); each side keeps its best round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
from mstar.v1 import inference_service_pb2 as isvc
from mstar.v1 import inference_service_pb2_grpc as isvc_grpc
from mstar.v1 import messages_pb2 as msg

from bench import procs


async def _one(stub, text: str, temperature: float, seed: int, max_tokens: int, speculative: bool | None):
    sampling = msg.SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens)
    if speculative is not None:
        sampling.speculative = speculative
    request = isvc.GenerateStreamRequest(input=msg.PreprocessInput(
        messages=[msg.ChatMessage(role="user", content=text)], model_kwargs=msg.ModelKwargs(sampling=sampling)))
    pieces, first, last, tokens = [], None, None, 0
    async for event in stub.GenerateStream(request):
        kind = event.WhichOneof("event")
        if kind == "chunk" and event.chunk.text:
            now = time.perf_counter()
            first, last = first or now, now
            pieces.append(event.chunk.text)
        elif kind == "failed":
            raise SystemExit(f"request failed: {event.failed.reason}: {event.failed.message}")
        elif kind == "complete":
            tokens = event.complete.usage.completion_tokens
    return "".join(pieces), first, last, tokens


async def _round(stub, texts: list[str], temperature: float, max_tokens: int, speculative: bool | None):
    results = await asyncio.gather(*(_one(stub, t, temperature, i, max_tokens, speculative)
                                     for i, t in enumerate(texts)))
    first = min(r[1] for r in results)
    last = max(r[2] for r in results)
    generated = sum(r[3] for r in results) - len(results)  # from each stream's first token on
    return generated / (last - first), [r[0] for r in results]


async def _measure(target: str, cases, prompt_text: Callable[[str, int], str], new_tokens: int, rounds: int):
    rows = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = isvc_grpc.InferenceServiceStub(channel)
        await _round(stub, [prompt_text("ordinary", 99)], 0.0, 8, None)  # warm: first requests allocate
        for name, streams, temperature in cases:
            texts = [prompt_text(name, i) for i in range(streams)]
            best, outputs = {False: 0.0, None: 0.0}, {}
            for r in range(rounds):
                for speculative in (False, None) if r % 2 == 0 else (None, False):
                    rate, out = await _round(stub, texts, temperature, new_tokens, speculative)
                    best[speculative] = max(best[speculative], rate)
                    outputs[speculative] = out
            if outputs[False] != outputs[None]:
                raise SystemExit(f"through the stack, {name} at temperature {temperature}: speculation changed the output")
            rows.append((name, streams, temperature, best[False], best[None]))
            print(f"stack {name:9s} x{streams:<3d} T={temperature} off {best[False]:7.1f} tok/s  "
                  f"policy {best[None]:7.1f} tok/s  {best[None] / best[False]:.2f}x", flush=True)
    return rows


def measure_stack(cases, prompt_text, new_tokens: int, rounds: int, threads: int):
    """[(workload, streams, temperature, off tok/s, policy tok/s)] on a fresh stack."""
    from services.stack.stack import Stack, StackConfig

    config = StackConfig.with_free_ports(log_dir=procs.ROOT / "bench" / "out" / "logs" / "speculation",
                                         ready_timeout_s=600.0, generation_args=["--threads", str(threads)])
    with Stack(config) as stack:
        return asyncio.run(_measure(stack.grpc_target, cases, prompt_text, new_tokens, rounds))
