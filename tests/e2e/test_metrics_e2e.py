"""/metrics after real requests: histograms moved, gauges back to idle, the conductor's pushed
snapshots re-exported by preprocess, one JSON log line per request. The stack serves metrics on
both services as `make run` does (StackConfig's metrics ports); own Stack (not the shared fixture)
for a faster conductor status interval."""

from __future__ import annotations

import json
import time

import grpc
import httpx
import pytest
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc
from mstar.v1 import messages_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families

from services.stack.stack import Stack, StackConfig

pytestmark = pytest.mark.e2e
HTTP_REQUESTS, GRPC_REQUESTS, MAX_TOKENS = 3, 1, 6


@pytest.fixture(scope="module")
def metered():
    config = StackConfig.with_free_ports(generation_args=["--status-interval-ms", "200"])
    with Stack(config) as stack:
        urls = stack.metrics_urls
        yield stack, urls["generation"], urls["preprocess"]


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def total(samples, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def send_requests(stack) -> None:
    body = {"model": "default", "prompt": "Count: one two three", "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": True}
    for _ in range(HTTP_REQUESTS):
        with httpx.stream("POST", stack.http_url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            assert any("[DONE]" in line for line in r.iter_lines())
    with grpc.insecure_channel(stack.grpc_target) as ch:
        stub = api_grpc.InferenceServiceStub(ch)
        sampling = pb.SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
        for _ in range(GRPC_REQUESTS):
            req = api.GenerateStreamRequest(input=pb.PreprocessInput(
                text="Count: one two three", model_kwargs=pb.ModelKwargs(sampling=sampling)))
            events = [e.WhichOneof("event") for e in stub.GenerateStream(req, timeout=120)]
            assert events[-1] == "complete"


def test_metrics_move_and_return_to_idle(metered):
    stack, gen_url, pre_url = metered
    before_gen, before_pre = scrape(gen_url), scrape(pre_url)
    send_requests(stack)
    n = HTTP_REQUESTS + GRPC_REQUESTS
    deadline = time.monotonic() + 10
    while True:  # gauges settle once the last terminal event is processed on both sides
        gen, pre = scrape(gen_url), scrape(pre_url)
        idle = (total(gen, "mstar_generation_requests_running") == 0
                and total(pre, "mstar_preprocess_requests_in_flight") == 0)
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert idle, "gauges did not return to idle"
    assert total(gen, "mstar_generation_requests_waiting") == 0
    assert total(gen, "mstar_generation_requests_preempted") == 0

    def moved(after, before, name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    for name in ("ttft_seconds_count", "e2e_seconds_count", "queue_seconds_count", "prefill_seconds_count",
                 "decode_seconds_count", "itl_seconds_count"):
        assert moved(gen, before_gen, "mstar_generation_" + name) >= n, name
    assert moved(gen, before_gen, "mstar_generation_requests_finished_total", finish_reason="length", status="OK") >= n
    assert moved(gen, before_gen, "mstar_generation_generation_tokens_total") >= n * MAX_TOKENS
    assert moved(gen, before_gen, "mstar_generation_steps_total") >= MAX_TOKENS
    assert total(gen, "mstar_generation_kv_blocks_free") > 0
    assert moved(pre, before_pre, "mstar_preprocess_ttft_seconds_count") >= n
    assert moved(pre, before_pre, "mstar_preprocess_itl_seconds_count") >= n
    assert moved(pre, before_pre, "mstar_preprocess_e2e_seconds_sum") > 0
    assert moved(pre, before_pre, "mstar_preprocess_requests_total", finish_reason="length", status="OK") >= n
    # Labelled by what the client called: the OpenAI requests are not counted as GenerateStream.
    assert moved(pre, before_pre, "mstar_preprocess_requests_total", surface="completions") == HTTP_REQUESTS
    assert moved(pre, before_pre, "mstar_preprocess_requests_total", surface="GenerateStream") == GRPC_REQUESTS
    assert moved(pre, before_pre, "mstar_preprocess_completion_tokens_total") >= n * MAX_TOKENS


def test_conductor_status_reexported_by_preprocess(metered):
    _stack, _gen_url, pre_url = metered
    deadline = time.monotonic() + 10
    while total(scrape(pre_url), "mstar_conductor_steps_total") == 0 and time.monotonic() < deadline:
        time.sleep(0.3)
    pre = scrape(pre_url)
    assert total(pre, "mstar_conductor_steps_total") > 0
    assert total(pre, "mstar_conductor_status_time_seconds") > time.time() - 60


def test_one_json_log_line_per_request(metered):
    stack, _gen_url, _pre_url = metered
    send_requests(stack)  # not relying on what other tests sent
    lines = [json.loads(ln) for ln in (stack.log_dir / "preprocess.log").read_text().splitlines()
             if ln.startswith("{") and '"request done"' in ln]
    assert len(lines) >= HTTP_REQUESTS + GRPC_REQUESTS
    assert all(ln["request_id"] and ln["finish_reason"] for ln in lines)
    assert {ln["surface"] for ln in lines} >= {"completions", "GenerateStream"}


def test_unary_http_carries_timing_headers(metered):
    stack, _gen_url, _pre_url = metered
    body = {"text": "Count: one two", "modelKwargs": {"sampling": {"maxTokens": 3, "temperature": 0}}}
    r = httpx.post(stack.http_url + "/v1/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert float(r.headers["x-mstar-e2e-ms"]) > 0
    assert int(r.headers["x-mstar-completion-tokens"]) == 3
    assert "x-mstar-time-to-first-token-ms" in r.headers
