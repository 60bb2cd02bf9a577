"""The Gateway API Inference Extension's model server protocol on a running stack: the endpoint
picker scrapes `vllm:num_requests_waiting`, `vllm:num_requests_running` and
`vllm:kv_cache_usage_perc` from the generation service's metrics port, and they must move with
load — waiting > 0 while requests queue behind a full batch, KV usage rising with context — and
return to idle. The null engine (real scheduler and block manager, no model) steps slowly enough
to scrape mid-flight; 2 sequences a step and 64 blocks of 16 tokens make the queue and the cache
fill with few requests."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.stack.stack import Stack, StackConfig

pytestmark = pytest.mark.e2e
GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
BLOCKS, BLOCK_SIZE = 64, 16


@pytest.fixture(scope="module")
def stack():
    config = StackConfig.with_free_ports(null_engine=True, generation_args=[
        "--null-step-ms", "25", "--max-num-seqs", "2", "--kv-blocks", str(BLOCKS), "--block-size", str(BLOCK_SIZE)])
    with Stack(config) as s:
        yield s


def scrape(url: str) -> dict[str, dict]:
    """name -> {labels tuple: value} for the vllm:* families."""
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for s in family.samples:
            if s.name.startswith("vllm:"):
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def gauge(samples: dict, name: str) -> float:
    (value,) = samples[name].values()  # one model: one series
    return value


def stream(stack, prompt: str, max_tokens: int) -> None:
    body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", stack.http_url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert any("[DONE]" in line for line in r.iter_lines())


def peak_while(stack, work: list[tuple[str, int]]) -> dict[str, float]:
    """Run the requests concurrently; the highest value each gauge showed while they ran."""
    threads = [threading.Thread(target=stream, args=(stack, p, n)) for p, n in work]
    for t in threads:
        t.start()
    peak = dict.fromkeys(GAUGES, 0.0)
    while any(t.is_alive() for t in threads):
        samples = scrape(stack.metrics_urls["generation"])
        peak = {name: max(peak[name], gauge(samples, name)) for name in GAUGES}
        time.sleep(0.02)
    for t in threads:
        t.join()
    return peak


def wait_idle(stack) -> dict:
    deadline = time.monotonic() + 10
    while True:
        samples = scrape(stack.metrics_urls["generation"])
        if all(gauge(samples, n) == 0 for n in GAUGES) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def test_the_protocol_gauges_are_served_with_vllm_names_and_labels(stack):
    samples = wait_idle(stack)
    for name in GAUGES:
        assert samples[name] == {(("model_name", "default"),): 0.0}, name
    assert samples["vllm:cache_config_info"] == {
        (("block_size", str(BLOCK_SIZE)), ("num_gpu_blocks", str(BLOCKS))): 1.0}


def test_waiting_counts_requests_queued_behind_a_full_batch(stack):
    peak = peak_while(stack, [("Count with me: one two three", 24)] * 5)
    assert peak["vllm:num_requests_running"] == 2  # the batch is full: --max-num-seqs 2
    assert peak["vllm:num_requests_waiting"] >= 1  # and the rest wait for a seat
    samples = wait_idle(stack)
    assert all(gauge(samples, n) == 0 for n in GAUGES)


def test_kv_usage_rises_with_context(stack):
    short = peak_while(stack, [("Hi", 8)])["vllm:kv_cache_usage_perc"]
    long_prompt = " ".join(["lorem ipsum dolor sit amet"] * 60)  # ~ 300+ tokens: 20+ of the 64 blocks
    long = peak_while(stack, [(long_prompt, 8)])["vllm:kv_cache_usage_perc"]
    assert 0 < short < long <= 1
    assert long >= 10 / BLOCKS
    assert gauge(wait_idle(stack), "vllm:kv_cache_usage_perc") == 0
