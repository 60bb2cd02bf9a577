"""services/common/metrics.py: names, values after events, the conductor export, HTTP serving."""

from __future__ import annotations

import json
import logging
import urllib.request
from types import SimpleNamespace

from mstar.generation.v1 import generation_service_pb2
from prometheus_client import generate_latest

from services.common.conductor_collector import conductor_metric_name
from services.common.finish import FinishReason
from services.common.logs import JsonFormatter
from services.common.metrics import (
    GenerationMetrics,
    PreprocessMetrics,
    RequestClock,
    request_timings,
    start_metrics_server,
    timing_headers,
)
from services.preprocess.request import Complete


def value(metrics, name, labels=None):
    return metrics.registry.get_sample_value(name, labels or {})


def completion(**over):
    base = dict(finish_reason=FinishReason.LENGTH, num_prompt_tokens=10, num_cached_tokens=0, num_output_tokens=5,
                queue_ms=2.0, prefill_ms=30.0, ttft_ms=40.0, decode_ms=80.0, e2e_ms=120.0, preempted_ms=0.0)
    return SimpleNamespace(**(base | over))


def test_generation_step_sets_gauges_and_counts():
    m = GenerationMetrics()
    tok = SimpleNamespace()
    step = SimpleNamespace(num_batched_tokens=40, tokens=[tok, tok, tok], completed=[], failed=[])
    engine = fake_engine(running=3, preemptions=1, q=32, h=16)
    engine.scheduler.waiting = [SimpleNamespace(timing=SimpleNamespace(preempted_at=1.0)),
                                SimpleNamespace(timing=SimpleNamespace(preempted_at=None))]
    m.on_engine_output(step, engine)
    assert value(m, "mstar_generation_requests_running") == 3
    assert value(m, "mstar_generation_requests_waiting") == 2
    assert value(m, "mstar_generation_requests_preempted") == 1
    assert value(m, "mstar_generation_kv_blocks_free") == 7
    assert value(m, "mstar_generation_steps_total") == 1
    assert value(m, "mstar_generation_generation_tokens_total") == 3
    assert value(m, "mstar_generation_preemptions_total") == 1
    assert value(m, "mstar_generation_prefix_cache_hits_tokens_total") == 16
    assert value(m, "mstar_generation_step_batch_tokens_sum") == 40
    m.on_engine_output(SimpleNamespace(num_batched_tokens=0, tokens=[], completed=[], failed=[]), fake_engine())
    assert value(m, "mstar_generation_requests_running") == 0


def test_generation_request_finished_observes_breakdown():
    m = GenerationMetrics()
    m.on_request_finished(completion())
    m.on_request_failed("INVALID_ARGUMENT")
    assert value(m, "mstar_generation_requests_finished_total", {"finish_reason": "length", "status": "OK"}) == 1
    assert value(m, "mstar_generation_requests_finished_total",
                 {"finish_reason": "error", "status": "INVALID_ARGUMENT"}) == 1
    assert value(m, "mstar_generation_ttft_seconds_sum") == 0.04
    assert abs(value(m, "mstar_generation_itl_seconds_sum") - 0.02) < 1e-12  # 80 ms over 4 gaps
    assert value(m, "mstar_generation_prompt_tokens_total") == 10
    assert value(m, "mstar_generation_preempted_seconds_count") == 0  # never preempted: not observed


def test_request_clock_counts_gaps_between_chunks_only():
    c = RequestClock(start=0.0)
    c.on_tokens(0, now=0.5)  # an empty chunk (held-back bytes) is not a token
    c.on_tokens(1, now=1.0)
    c.on_tokens(2, now=1.1)
    c.on_tokens(1, now=1.3)
    assert c.ttft_s == 1.0 and c.tokens == 4
    assert [round(g, 6) for g in c.gaps] == [0.1, 0.2]


def test_preprocess_request_done_and_json_log(caplog):
    m = PreprocessMetrics()
    clock = m.on_request_started("GenerateStream")
    assert value(m, "mstar_preprocess_requests_in_flight", {"surface": "GenerateStream"}) == 1
    clock.on_tokens(1)
    clock.on_tokens(1)
    with caplog.at_level(logging.INFO, logger="mstar.requests"):
        m.on_request_done("r-1", clock, surface="GenerateStream", finish_reason="length", prompt_tokens=7,
                          timings={"queue_ms": 1.23456})
    assert value(m, "mstar_preprocess_requests_in_flight", {"surface": "GenerateStream"}) == 0
    assert value(m, "mstar_preprocess_requests_total",
                 {"surface": "GenerateStream", "finish_reason": "length", "status": "OK"}) == 1
    assert value(m, "mstar_preprocess_completion_tokens_total") == 2
    assert value(m, "mstar_preprocess_ttft_seconds_count") == 1
    assert value(m, "mstar_preprocess_itl_seconds_count") == 1
    line = json.loads(JsonFormatter().format(caplog.records[-1]))
    assert line["msg"] == "request done" and line["request_id"] == "r-1" and line["queue_ms"] == 1.235
    m.on_admission_rejected("TOO_MANY_REQUESTS")
    assert value(m, "mstar_preprocess_admission_rejections_total", {"reason": "TOO_MANY_REQUESTS"}) == 1


def test_conductor_status_export():
    m = PreprocessMetrics()
    status = generation_service_pb2.ConductorStatus()
    status.time.FromSeconds(1_700_000_000)
    status.metrics.add(family="mstar_generation", name="kv_blocks_used", value=12,
                       kind=generation_service_pb2.METRIC_KIND_GAUGE)
    status.metrics.add(family="mstar_generation", name="steps", value=99,
                       kind=generation_service_pb2.METRIC_KIND_COUNTER)
    a, b = {"replica": "10.0.0.1:50052"}, {"replica": "10.0.0.2:50052"}
    m.on_conductor_status(status, a["replica"])
    status.metrics[0].value = 3
    m.on_conductor_status(status, b["replica"])
    assert value(m, "mstar_conductor_kv_blocks_used", a) == 12
    assert value(m, "mstar_conductor_kv_blocks_used", b) == 3
    assert value(m, "mstar_conductor_steps_total", a) == 99
    assert value(m, "mstar_conductor_status_time_seconds", a) == 1_700_000_000
    # A newer snapshot replaces that replica's old one wholesale; a replica that left disappears.
    m.on_conductor_status(generation_service_pb2.ConductorStatus(), a["replica"])
    assert value(m, "mstar_conductor_kv_blocks_used", a) is None
    m.conductor.forget(b["replica"])
    assert value(m, "mstar_conductor_kv_blocks_used", b) is None
    assert value(m, "mstar_conductor_status_time_seconds", b) is None
    assert conductor_metric_name("a.b-c_total") == "mstar_conductor_a_b_c"


def test_timing_headers_and_timings_of_a_complete():
    done = Complete("r", FinishReason.END, "", prompt_tokens=5, cached_prompt_tokens=2, completion_tokens=3, chunks=1,
                    timings_ms={"time_to_first_token_ms": 12.5})
    meta = dict(timing_headers(done))
    assert meta["x-mstar-time-to-first-token-ms"] == "12.500"
    assert meta["x-mstar-completion-tokens"] == "3" and meta["x-mstar-cached-prompt-tokens"] == "2"
    assert all(k == k.lower() for k in meta)  # gRPC metadata keys must be lowercase
    assert request_timings(done)["time_to_first_token_ms"] == 12.5 and request_timings(done)["queue_ms"] == 0.0


def test_metrics_server_serves_exposition():
    m = GenerationMetrics()
    m.on_engine_output(SimpleNamespace(num_batched_tokens=1, tokens=[object()], completed=[], failed=[]),
                       fake_engine(running=1))
    port = start_metrics_server("127.0.0.1", 0, m.registry)
    reply = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    body = reply.read().decode()
    assert reply.headers["Content-Type"].startswith("text/plain")
    assert "mstar_generation_steps_total 1.0" in body
    assert 'mstar_generation_step_batch_tokens_bucket{le="1.0"} 1.0' in body
    assert body == generate_latest(m.registry).decode()  # the whole registry, nothing else


def fake_engine(running=0, preemptions=0, q=0, h=0, proposed=0, accepted=0, proposer="ngram"):
    return SimpleNamespace(
        speculator=SimpleNamespace(proposer=proposer),
        scheduler=SimpleNamespace(running=[object()] * running, waiting=[], num_preemptions=preemptions),
        block_manager=SimpleNamespace(num_used_blocks=running, num_free_blocks=10 - running,
                                      num_prefix_query_tokens=q, num_prefix_hit_tokens=h),
        stats=SimpleNamespace(num_spec_proposed=proposed, num_spec_accepted=accepted),
    )


def test_on_engine_output_is_the_whole_step_wiring():
    m = GenerationMetrics()
    tok = SimpleNamespace()
    step = SimpleNamespace(num_batched_tokens=20, tokens=[tok, tok], completed=[], failed=[])
    m.on_engine_output(step, fake_engine(running=2, preemptions=1, q=32, h=16))
    m.on_engine_output(step, fake_engine(running=2, preemptions=1, q=32, h=16))
    failure = SimpleNamespace(error=SimpleNamespace(code=SimpleNamespace(name="INTERNAL")))
    last = SimpleNamespace(num_batched_tokens=2, tokens=[tok], completed=[completion()], failed=[failure])
    m.on_engine_output(last, fake_engine(running=0, preemptions=1, q=64, h=16, proposed=8, accepted=5))
    assert value(m, "mstar_generation_steps_total") == 3
    assert value(m, "mstar_generation_spec_decode_draft_tokens_total", {"proposer": "ngram"}) == 8
    assert value(m, "mstar_generation_spec_decode_accepted_tokens_total", {"proposer": "ngram"}) == 5
    assert value(m, "mstar_generation_step_seconds_count") == 2  # the first step followed idleness
    assert value(m, "mstar_generation_generation_tokens_total") == 5
    assert value(m, "mstar_generation_preemptions_total") == 1  # cumulative engine counter, counted once
    assert value(m, "mstar_generation_prefix_cache_queries_tokens_total") == 64
    assert value(m, "mstar_generation_requests_running") == 0
    assert value(m, "mstar_generation_kv_blocks_used") == 0
    assert value(m, "mstar_generation_requests_finished_total", {"finish_reason": "error", "status": "INTERNAL"}) == 1
    assert value(m, "mstar_generation_e2e_seconds_count") == 1


def test_observe_wraps_a_request_event_stream():
    import asyncio

    chunk = SimpleNamespace(token_ids=(5, 6), text="ab")
    done = SimpleNamespace(finish_reason=FinishReason.LENGTH, prompt_tokens=4, completion_tokens=3, timings_ms={"queue_ms": 1.0})
    failed = SimpleNamespace(error=SimpleNamespace(code=SimpleNamespace(name="UNAVAILABLE")))

    async def events(*evs):
        for e in evs:
            yield e

    async def consume(m, evs, stop_after=None):
        seen = []
        gen = m.observe(events(*evs), "r", surface="Session")
        async for e in gen:
            seen.append(e)
            if stop_after and len(seen) == stop_after:
                break
        await gen.aclose()  # what the servicer's generator close does when the client goes away
        return seen

    m = PreprocessMetrics()
    assert asyncio.run(consume(m, [chunk, SimpleNamespace(token_ids=(7,), text="c"), done]))[-1] is done
    asyncio.run(consume(m, [chunk, failed]))
    asyncio.run(consume(m, [chunk, chunk, done], stop_after=1))
    assert value(m, "mstar_preprocess_requests_total", {"surface": "Session", "finish_reason": "length", "status": "OK"}) == 1
    assert value(m, "mstar_preprocess_requests_total",
                 {"surface": "Session", "finish_reason": "error", "status": "UNAVAILABLE"}) == 1
    assert value(m, "mstar_preprocess_requests_total",
                 {"surface": "Session", "finish_reason": "cancelled", "status": "CANCELLED"}) == 1
    assert value(m, "mstar_preprocess_requests_in_flight", {"surface": "Session"}) == 0
    assert value(m, "mstar_preprocess_itl_seconds_count") == 1  # only the first request had two chunks
    assert value(m, "mstar_preprocess_completion_tokens_total") == 3 + 2 + 2


def test_observe_records_the_terminal_event_before_handing_it_on():
    import asyncio

    done = SimpleNamespace(finish_reason=FinishReason.END, prompt_tokens=1, completion_tokens=0, timings_ms={})
    m = PreprocessMetrics()

    async def events():
        yield done

    async def unary():  # returns on the terminal event and never resumes the generator
        gen = m.observe(events(), "u", surface="Generate")
        async for e in gen:
            assert value(m, "mstar_preprocess_requests_total",
                         {"surface": "Generate", "finish_reason": "stop", "status": "OK"}) == 1
            assert value(m, "mstar_preprocess_requests_in_flight", {"surface": "Generate"}) == 0
            return e

    assert asyncio.run(unary()) is done
    assert value(m, "mstar_preprocess_requests_total",
                 {"surface": "Generate", "finish_reason": "cancelled", "status": "CANCELLED"}) is None


def test_model_server_protocol_gauges_follow_the_scheduler():
    """GIE's endpoint picker reads these exact names (vLLM's); KV usage is a fraction, not a percent."""
    m = GenerationMetrics(model_name="m")
    assert value(m, "vllm:num_requests_waiting", {"model_name": "m"}) == 0  # present before the first step
    assert value(m, "vllm:kv_cache_usage_perc", {"model_name": "m"}) == 0
    m.describe_cache(block_size=16, num_blocks=10)
    assert value(m, "vllm:cache_config_info", {"block_size": "16", "num_gpu_blocks": "10"}) == 1
    engine = fake_engine(running=3)
    engine.scheduler.waiting = [SimpleNamespace(timing=SimpleNamespace(preempted_at=None))] * 2
    m.on_engine_output(SimpleNamespace(num_batched_tokens=3, tokens=[], completed=[], failed=[]), engine)
    assert value(m, "vllm:num_requests_running", {"model_name": "m"}) == 3
    assert value(m, "vllm:num_requests_waiting", {"model_name": "m"}) == 2
    assert value(m, "vllm:kv_cache_usage_perc", {"model_name": "m"}) == 0.3  # 3 of 10 blocks
    exposition = generate_latest(m.registry).decode()
    assert 'vllm:num_requests_running{model_name="m"} 3.0' in exposition
    m.on_engine_output(SimpleNamespace(num_batched_tokens=0, tokens=[], completed=[], failed=[]), fake_engine())
    assert value(m, "vllm:num_requests_running", {"model_name": "m"}) == 0
    assert value(m, "vllm:kv_cache_usage_perc", {"model_name": "m"}) == 0


def test_speculation_is_counted_under_the_servers_proposer():
    m = GenerationMetrics()
    step = SimpleNamespace(num_batched_tokens=1, tokens=[], completed=[], failed=[])
    m.on_engine_output(step, fake_engine(proposed=6, accepted=4, proposer="draft"))
    assert value(m, "mstar_generation_spec_decode_draft_tokens_total", {"proposer": "draft"}) == 6
    assert value(m, "mstar_generation_spec_decode_accepted_tokens_total", {"proposer": "draft"}) == 4
    assert value(m, "mstar_generation_spec_decode_draft_tokens_total", {"proposer": "ngram"}) in (None, 0)


def test_preprocessed_inputs_are_counted_by_modality():
    from services.common.metrics import PreprocessMetrics
    from services.preprocess.request import InputInfo

    m = PreprocessMetrics()
    m.on_preprocessed(0.01, (InputInfo("text", 12, 3), InputInfo("image", 5000, 320, "image/png"),
                             InputInfo("image", 700, 64, "image/jpeg")))
    assert value(m, "mstar_preprocess_input_parts_total", {"modality": "image"}) == 2
    assert value(m, "mstar_preprocess_input_bytes_total", {"modality": "image"}) == 5700
    assert value(m, "mstar_preprocess_input_parts_total", {"modality": "text"}) == 1
