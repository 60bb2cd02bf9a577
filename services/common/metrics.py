"""Prometheus metrics for both services: one small class per service, one call per event.

Each service owns a private CollectorRegistry (so tests and two services in one process never
collide) and serves it on its own port with `start_metrics_server`. Every name, type and label is
listed in docs/metrics.md; keep the two in step. Labels are low-cardinality enums only, never
request ids (those go to the JSON log line written at completion).

    gen = GenerationMetrics()                    pre = PreprocessMetrics()
    gen.on_engine_output(step_output, engine)    pre.on_admission_rejected("OVERLOADED")
    # (engine thread, every step)                async for e in pre.observe(events, rid, surface="Generate"): ...
                                                 pre.on_conductor_status(status_pb)
    start_metrics_server("0.0.0.0", 9101, gen.registry)
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from services.common.conductor_collector import ConductorCollector
from services.common.model_server_metrics import ModelServerGauges

# Latency buckets (seconds) sized for a CPU box: a 135M model's decode step is 10-150 ms and a
# long prefill or a deep queue reaches tens of seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# How long a streamed input stays open: appends arrive over seconds to minutes (lifetime cap 300 s).
OPEN_INPUT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

request_log = logging.getLogger("mstar.requests")


def start_metrics_server(host: str, port: int, registry: CollectorRegistry) -> int:
    """Serve `registry` as text exposition on http://host:port/metrics from a daemon thread (it
    never touches the asyncio loop). Port 0 picks a free port; the bound port is returned."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_address[1])


def _histogram(name: str, doc: str, registry: CollectorRegistry, buckets=LATENCY_BUCKETS, labels=()):
    return Histogram(name, doc, labelnames=labels, buckets=buckets, registry=registry)


class _ServingGauges:
    """<prefix>serving_state{state} (1 for the current ServingState, 0 for the others) and
    <prefix>ready (1 while health reports SERVING: serving and every dependency up)."""

    def __init__(self, prefix: str, registry: CollectorRegistry) -> None:
        from services.common.serving import State

        self._states = [s.value for s in State]
        self.state = Gauge(prefix + "serving_state", "1 for the process's serving state (starting, serving, "
                           "draining, failed), 0 for the others.", labelnames=("state",), registry=registry)
        self.ready = Gauge(prefix + "ready", "1 while health reports SERVING (state serving and every "
                           "dependency up).", registry=registry)

    def __call__(self, serving: Any) -> None:
        for name in self._states:
            self.state.labels(name).set(1 if name == serving.state.value else 0)
        self.ready.set(1 if serving.is_ready else 0)


class GenerationMetrics:
    """The engine's metrics (prefix mstar_generation_). Called from the engine loop thread;
    prometheus-client metrics are thread-safe, so the HTTP thread may scrape at any time."""

    def __init__(self, registry: CollectorRegistry | None = None, model_name: str = "default") -> None:
        r = self.registry = registry or CollectorRegistry()
        p = "mstar_generation_"
        self.running = Gauge(p + "requests_running", "Requests scheduled in the current step.", registry=r)
        self.waiting = Gauge(p + "requests_waiting", "Requests queued for admission to a step.", registry=r)
        self.preempted = Gauge(p + "requests_preempted", "Requests whose KV blocks were reclaimed, "
                               "waiting to be recomputed.", registry=r)
        self.kv_used = Gauge(p + "kv_blocks_used", "Paged KV cache blocks in use.", registry=r)
        self.kv_free = Gauge(p + "kv_blocks_free", "Paged KV cache blocks free.", registry=r)
        self.steps = Counter(p + "steps", "Engine steps run.", registry=r)
        self.step_seconds = _histogram(p + "step_seconds", "Wall time of one engine step (model "
                                       "forward + sampling).", r, STEP_BUCKETS)
        self.step_tokens = _histogram(p + "step_batch_tokens", "Tokens batched in one step (prefill "
                                      "chunks + one per decoding row).", r, TOKEN_BUCKETS)
        self.preemptions = Counter(p + "preemptions", "Times a request was preempted.", registry=r)
        self.prefix_queries = Counter(p + "prefix_cache_queries_tokens", "Prompt tokens looked up in "
                                      "the prefix cache.", registry=r)
        self.prefix_hits = Counter(p + "prefix_cache_hits_tokens", "Prompt tokens served from the "
                                   "prefix cache.", registry=r)
        self.spec_drafts = Counter(p + "spec_decode_draft_tokens", "Tokens proposed to speculative verify "
                                   "steps, by proposer.", ["proposer"], registry=r)
        self.spec_accepted = Counter(p + "spec_decode_accepted_tokens", "Proposed tokens the verify steps "
                                     "accepted, by proposer.", ["proposer"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated.", registry=r)
        self.finished = Counter(p + "requests_finished", "Requests ended, by finish reason and status "
                                "(a gRPC code name; OK for normal completion).",
                                labelnames=("finish_reason", "status"), registry=r)
        self.queue = _histogram(p + "queue_seconds", "Arrival to first scheduling.", r)
        self.prefill = _histogram(p + "prefill_seconds", "Time in prefill steps.", r)
        self.ttft = _histogram(p + "ttft_seconds", "Arrival (or last append) to first token.", r)
        self.decode = _histogram(p + "decode_seconds", "First token to last token.", r)
        self.itl = _histogram(p + "itl_seconds", "Mean inter-token latency of one request "
                              "(decode time / (tokens - 1)).", r)
        self.e2e = _histogram(p + "e2e_seconds", "Arrival to completion.", r)
        self.preempted_time = _histogram(p + "preempted_seconds", "Time a request spent preempted.", r)
        self._serving = _ServingGauges(p, r)
        self._model_protocol = ModelServerGauges(r, model_name)
        self._busy = False
        self._last_output: float | None = None
        self._seen: dict[str, float] = {}

    def watch_serving(self, state: Any) -> None:
        """Follow a ServingState (services/common/serving.py) in the serving gauges."""
        state.on_change(self._serving)

    def describe_cache(self, block_size: int, num_blocks: int) -> None:
        """The paged KV cache's shape, once the engine exists (vllm:cache_config_info)."""
        self._model_protocol.describe_cache(block_size, num_blocks)

    def set_idle_state(self, running: int, waiting: int, preempted: int, kv_used: int, kv_free: int) -> None:
        """Gauges only: the scheduler's state as it leaves the step (0 running once idle)."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.preempted.set(preempted)
        self.kv_used.set(kv_used)
        self.kv_free.set(kv_free)
        self._model_protocol.set(running, waiting, kv_used, kv_free)

    def on_request_finished(self, completion: Any, status: str = "OK") -> None:
        """One finished request. `completion` has the engine Completion's fields (finish_reason,
        num_prompt_tokens, num_output_tokens, queue_ms, prefill_ms, ttft_ms, decode_ms, e2e_ms,
        preempted_ms) — milliseconds, like the Timings message it also fills."""
        c = completion
        self.finished.labels(c.finish_reason.label, status).inc()
        self.prompt_tokens.inc(c.num_prompt_tokens)
        self.queue.observe(c.queue_ms / 1e3)
        self.prefill.observe(c.prefill_ms / 1e3)
        self.e2e.observe(c.e2e_ms / 1e3)
        if c.preempted_ms:
            self.preempted_time.observe(c.preempted_ms / 1e3)
        if c.num_output_tokens:
            self.ttft.observe(c.ttft_ms / 1e3)
            self.decode.observe(c.decode_ms / 1e3)
        if c.num_output_tokens > 1:
            self.itl.observe(c.decode_ms / 1e3 / (c.num_output_tokens - 1))

    def on_request_failed(self, status: str) -> None:
        """A request that ended with RequestFailed; `status` is the gRPC code name."""
        self.finished.labels("error", status).inc()

    def on_engine_output(self, out: Any, engine: Any) -> None:
        """The whole per-step wiring in one call, made from the engine's step callback (engine
        thread) with its StepOutput. Reads the fields EngineStats reads (scheduler.running /
        waiting / num_preemptions, block_manager.num_used_blocks / num_free_blocks /
        num_prefix_query_tokens / num_prefix_hit_tokens). The step time is the loop iteration's
        wall time, observed only while the engine was already busy (so idle waits never count)."""
        now = time.monotonic()
        sched, bm = engine.scheduler, engine.block_manager
        running, waiting = len(sched.running), len(sched.waiting)
        if self._busy and self._last_output is not None:
            self.steps.inc()
            self.step_seconds.observe(now - self._last_output)
        elif out.num_batched_tokens:
            self.steps.inc()
        if out.num_batched_tokens:
            self.step_tokens.observe(out.num_batched_tokens)
        preempted = sum(1 for s in tuple(sched.waiting) if getattr(s.timing, "preempted_at", None) is not None)
        self.set_idle_state(running, waiting, preempted, bm.num_used_blocks, bm.num_free_blocks)
        self.generation_tokens.inc(len(out.tokens))
        self._count_delta("preemptions", sched.num_preemptions, self.preemptions)
        self._count_delta("prefix_q", bm.num_prefix_query_tokens, self.prefix_queries)
        self._count_delta("prefix_h", bm.num_prefix_hit_tokens, self.prefix_hits)
        proposer = engine.speculator.proposer
        self._count_delta("spec_d", engine.stats.num_spec_proposed, self.spec_drafts.labels(proposer))
        self._count_delta("spec_a", engine.stats.num_spec_accepted, self.spec_accepted.labels(proposer))
        for c in out.completed:
            self.on_request_finished(c)
        for f in out.failed:
            self.on_request_failed(f.error.code.name)
        self._busy = running + waiting > 0
        self._last_output = time.monotonic()

    def _count_delta(self, key: str, cumulative: float, counter: Counter) -> None:
        # Engine counters are cumulative; Prometheus counters take increments.
        delta = cumulative - self._seen.get(key, 0)
        if delta > 0:
            counter.inc(delta)
        self._seen[key] = cumulative


@dataclass
class RequestClock:
    """Timestamps of one request as the public API sees it; feed it chunks, hand it to
    PreprocessMetrics.on_request_done. Monotonic seconds."""

    start: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0

    def on_tokens(self, n: int = 1, now: float | None = None) -> None:
        """A chunk carrying `n` tokens left for the client. Tokens of one chunk share a timestamp,
        so only the gap between chunks is an inter-token latency."""
        if n <= 0:
            return
        now = time.monotonic() if now is None else now
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            self.gaps.append(now - self.last_token)
        self.last_token = now
        self.tokens += n

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start


class PreprocessMetrics:
    """The public API's metrics (prefix mstar_preprocess_), as a client would measure them, plus
    the conductor's pushed snapshots (prefix mstar_conductor_). Call from the asyncio loop."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        p = "mstar_preprocess_"
        # `surface`: what the client called, a native RPC name (Generate, GenerateStream, Session) or
        # an HTTP API (chat.completions, completions): the caller passes it, nothing is inferred.
        self.in_flight = Gauge(p + "requests_in_flight", "Admitted requests not yet ended, by surface.",
                               labelnames=("surface",), registry=r)
        self.rejections = Counter(p + "admission_rejections", "Requests refused by admission or "
                                  "validation before starting, by reason.", labelnames=("reason",), registry=r)
        self.requests = Counter(p + "requests", "Requests ended, by surface, finish reason and status.",
                                labelnames=("surface", "finish_reason", "status"), registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of ended requests.", registry=r)
        self.completion_tokens = Counter(p + "completion_tokens", "Tokens sent to clients.", registry=r)
        self.ttft = _histogram(p + "ttft_seconds", "Arrival at the API to the first text chunk sent.", r)
        self.itl = _histogram(p + "itl_seconds", "Gap between consecutive chunks sent to a client.", r)
        self.e2e = _histogram(p + "e2e_seconds", "Arrival at the API to the terminal event.", r)
        self.preprocess = _histogram(p + "preprocess_seconds", "Template + tokenization + checks of one "
                                     "request.", r, STEP_BUCKETS)
        self.input_parts = Counter(p + "input_parts", "Prompt inputs of admitted requests, by modality (an "
                                   "image counts once).", labelnames=("modality",), registry=r)
        self.input_bytes = Counter(p + "input_bytes", "Bytes of those inputs as sent (an image's encoded file).",
                                   labelnames=("modality",), registry=r)
        self.failures = Counter(p + "requests_failed", "Requests that ended with an error, by its ErrorInfo "
                                "reason (e.g. INPUT_OPEN_TOO_LONG, BACKEND_STALLED).", labelnames=("reason",),
                                registry=r)
        self.input_open = _histogram(p + "input_open_seconds", "How long a streamed input stayed open (start "
                                     "to its end, or to the end of the request).", r, OPEN_INPUT_BUCKETS)
        self.conductor = ConductorCollector()
        r.register(self.conductor)
        self._serving = _ServingGauges(p, r)

    def watch_serving(self, state: Any) -> None:
        """Follow a ServingState (services/common/serving.py) in the serving gauges."""
        state.on_change(self._serving)

    def on_request_started(self, surface: str) -> RequestClock:
        """Call once admitted; the returned clock goes back into on_request_done."""
        self.in_flight.labels(surface).inc()
        return RequestClock()

    def on_preprocessed(self, seconds: float, inputs: tuple = ()) -> None:
        """A request was admitted after `seconds` of preprocessing; inputs: its InputInfos."""
        self.preprocess.observe(seconds)
        for info in inputs:
            self.input_parts.labels(info.modality).inc()
            self.input_bytes.labels(info.modality).inc(info.size_bytes)

    def on_input_closed(self, seconds: float) -> None:
        """A request that had a streamed input ended; `seconds` it was open."""
        self.input_open.observe(seconds)

    def watch_admission(self, admission: Any) -> None:
        """Export an Admission's fairness state at scrape time (admission.snapshot())."""
        self.registry.register(_AdmissionCollector(admission))

    def on_admission_rejected(self, reason: str) -> None:
        """`reason` is the ErrorInfo reason, e.g. TOO_MANY_REQUESTS or PROMPT_TOO_LONG."""
        self.rejections.labels(reason).inc()

    def on_request_done(
        self,
        request_id: str,
        clock: RequestClock,
        *,
        surface: str,
        finish_reason: str,
        status: str = "OK",
        prompt_tokens: int = 0,
        completion_tokens: int | None = None,
        timings: dict[str, float] | None = None,
    ) -> None:
        """The terminal event of a request started with on_request_started: observe its latencies,
        count it, and write its one JSON log line (request id + engine timings, in ms)."""
        e2e = time.monotonic() - clock.start
        out_tokens = clock.tokens if completion_tokens is None else completion_tokens
        self.in_flight.labels(surface).dec()
        self.requests.labels(surface, finish_reason, status).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(out_tokens)
        self.e2e.observe(e2e)
        if clock.ttft_s is not None:
            self.ttft.observe(clock.ttft_s)
        for gap in clock.gaps:
            self.itl.observe(gap)
        request_log.info("request done", extra={
            "request_id": request_id, "surface": surface, "finish_reason": finish_reason, "status": status,
            "prompt_tokens": prompt_tokens, "completion_tokens": out_tokens,
            "api_ttft_ms": None if clock.ttft_s is None else round(clock.ttft_s * 1e3, 3),
            "api_e2e_ms": round(e2e * 1e3, 3), **{k: round(v, 3) for k, v in (timings or {}).items()},
        })

    async def observe(self, events: AsyncIterator, request_id: str, surface: str) -> AsyncIterator:
        """The whole per-request wiring in one call: wrap a request's event stream,
        `async for event in metrics.observe(run.events(), run.request_id, surface="GenerateStream")`.
        Duck-typed on the preprocess events: a chunk has `token_ids`; the terminal Complete has
        finish_reason / prompt_tokens / completion_tokens / timings_ms; Failed has `error` (an
        MstarError). A stream closed before its terminal event (client gone) counts as cancelled."""
        clock = self.on_request_started(surface)
        done = False
        try:
            async for event in events:
                end = None
                if hasattr(event, "token_ids") and not hasattr(event, "finish_reason"):
                    clock.on_tokens(len(event.token_ids))
                elif hasattr(event, "finish_reason") and hasattr(event, "completion_tokens"):
                    end = {"finish_reason": event.finish_reason.label, "status": "OK", "prompt_tokens": event.prompt_tokens,
                           "completion_tokens": event.completion_tokens, "timings": dict(event.timings_ms)}
                elif hasattr(event, "error") and hasattr(event.error, "code"):
                    end = {"finish_reason": "error", "status": event.error.code.name}
                    self.failures.labels(getattr(event.error, "reason", "") or event.error.code.name).inc()
                if end is not None and not done:
                    # Recorded before the terminal event is handed on: a caller that returns on
                    # it (unary Generate) may never resume this generator.
                    done = True
                    self.on_request_done(request_id, clock, surface=surface, **end)
                yield event
        finally:
            if not done:
                self.on_request_done(request_id, clock, surface=surface, finish_reason="cancelled",
                                     status="CANCELLED")

    def on_conductor_status(self, status: Any, replica: str = "") -> None:
        """Export a ConductorStatus protobuf pushed by the generation replica `replica` (host:port)."""
        self.conductor.update(status, replica)


class _AdmissionCollector:
    """mstar_preprocess_admission_* gauges, read from the Admission when scraped."""

    _GAUGES = {
        "clients": "Clients holding admission slots (API-key clients, or client addresses).",
        "busiest_client_requests": "Requests in flight of the client holding the most.",
        "open_inputs": "Admitted requests whose input is still open.",
    }

    def __init__(self, admission: Any) -> None:
        self._admission = admission

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        snapshot = self._admission.snapshot()
        for key, doc in self._GAUGES.items():
            yield GaugeMetricFamily("mstar_preprocess_admission_" + key, doc, value=snapshot[key])


# Per-request breakdown for the HTTP surfaces: response headers on unary calls (sent as gRPC
# initial metadata, which Envoy turns into headers) and the OpenAI `usage` extension.
_TIMING_FIELDS = ("queue_ms", "prefill_ms", "time_to_first_token_ms", "decode_ms", "e2e_ms", "preempted_ms")


def request_timings(done: Any) -> dict[str, float]:
    """A domain Complete's engine timings (ms), e.g. for the OpenAI `usage.mstar_timings` extension."""
    return {f: round(float(done.timings_ms.get(f, 0.0)), 3) for f in _TIMING_FIELDS}


def timing_headers(done: Any) -> tuple[tuple[str, str], ...]:
    """x-mstar-* response headers of a domain Complete (queue, prefill, ttft, decode, e2e in ms;
    prompt, cached and completion token counts); sent as gRPC initial metadata, which Envoy
    passes on as HTTP headers."""
    pairs = [("x-mstar-" + f.removesuffix("_ms").replace("_", "-") + "-ms", f"{v:.3f}")
             for f, v in request_timings(done).items()]
    pairs += [("x-mstar-prompt-tokens", str(done.prompt_tokens)),
              ("x-mstar-cached-prompt-tokens", str(done.cached_prompt_tokens)),
              ("x-mstar-completion-tokens", str(done.completion_tokens))]
    return tuple(pairs)
