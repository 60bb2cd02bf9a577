"""The stack's HTTP face behind an inference gateway as GIE (the Kubernetes Gateway API Inference
Extension) builds one: a real Envoy whose ext_proc filter asks an endpoint picker for each request
and routes to the `x-gateway-destination-endpoint` it sets, through an ORIGINAL_DST cluster
(tests/e2e/gateway/). The two "pods" are whole stacks (Envoy + preprocess + generation) with the
null engine, so the test checks transport and routing, not a model; the picker is a test one with
a deterministic rule (tests/e2e/gateway/picker.py), wire-compatible with GIE's EPP on this path.

What it proves: SSE streams pass through intact and incrementally; every request reaches the pod
the picker chose, and only that pod (a client-sent destination header is overwritten); non-streamed
replies and OpenAI-shaped errors pass unchanged. What Envoy answers when routing cannot happen:
  - picked pod down (connection refused): 503 text/plain "upstream connect error or disconnect/reset
    before headers. reset reason: remote connection failure", at once, streamed or not (an address
    with no route answers the same just as fast; a pod that silently drops packets would be
    bounded by the cluster's connect_timeout, 1 s here: Envoy's contract, not measured here);
  - picker unreachable with failure_mode_allow false (fail closed): 500 with an empty body.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.stack import readiness
from services.stack.ports import free_port
from services.stack.stack import Stack, StackConfig
from tests.e2e.gateway.envoy import Gateway
from tests.e2e.gateway.picker import DESTINATION_HEADER, PICK_HEADER, Picker

pytestmark = pytest.mark.e2e

STEP_MS = 20  # null engine step: a 10-token stream lasts ~200 ms, long enough to see it arrive in parts
CHAT = {"model": "default", "max_tokens": 10, "temperature": 0,
        "messages": [{"role": "user", "content": "Name a color."}]}
COMPLETION = {"model": "default", "prompt": "Count:", "max_tokens": 3, "temperature": 0}
# Differ between any two requests, wherever they are served: compared after removing them.
PER_REQUEST = ("id", "created")


@dataclass
class Pool:
    pods: list[Stack]
    picker: Picker
    gateway: Gateway
    dead: str  # an endpoint the picker can name where nothing listens

    def endpoint(self, i: int) -> str:
        return f"127.0.0.1:{self.pods[i].config.http_port}"


class _Pods:
    """Starts pods on free ports no other pod of this module holds (with_free_ports only knows its
    own), once more on fresh ports if a start fails: between choosing a free port and binding it,
    any process on the box may take it (an outgoing connection's ephemeral port, another suite)."""

    def __init__(self) -> None:
        self.taken: set[int] = set()
        self.lock = threading.Lock()

    def config(self, log_dir: Path) -> StackConfig:
        with self.lock:
            while True:
                config = StackConfig.with_free_ports(null_engine=True, log_dir=log_dir,
                                                     generation_args=["--null-step-ms", str(STEP_MS)])
                ports = {port for name, port in vars(config).items() if name.endswith("_port")}
                if not ports & self.taken:
                    self.taken |= ports
                    return config

    def start(self, log_dir: Path) -> Stack:
        for attempt in (1, 2):
            try:
                return Stack(self.config(log_dir / f"try-{attempt}")).start()  # stops itself on failure
            except readiness.NotReady as exc:
                if attempt == 2:
                    raise
                warnings.warn(f"pod start retried on fresh ports: {str(exc).splitlines()[0]}", stacklevel=1)
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gateway")
    picker = gateway = None
    # Both pods start at once: a null-engine stack is ready in ~5 s, mostly preprocess start-up.
    # The starting threads must outlive the pods: a Child's PR_SET_PDEATHSIG fires when the thread
    # that spawned it exits, so a `with` around the pool would kill every pod as it closed.
    starting = ThreadPoolExecutor(2, thread_name_prefix="pod-start")
    starter = _Pods()
    starts = [starting.submit(starter.start, tmp / name) for name in ("pod-a", "pod-b")]
    pods: list[Stack] = []
    try:
        failures = []
        for started in starts:
            try:
                pods.append(started.result())
            except Exception as exc:  # noqa: BLE001 - raised below, once every started pod is in `pods`
                failures.append(exc)
        if failures:
            raise failures[0]
        dead = f"127.0.0.1:{free_port()}"
        picker = Picker([f"127.0.0.1:{pod.config.http_port}" for pod in pods] + [dead]).start()
        gateway = Gateway.start(picker.port, tmp)
        yield Pool(pods, picker, gateway, dead)
    finally:
        if gateway is not None:
            gateway.stop()
        if picker is not None:
            picker.stop()
        # In parallel (a preprocess takes ~2 s to drain and stop), from the threads that started them.
        list(starting.map(Stack.stop, pods))
        starting.shutdown()


@dataclass
class Streamed:
    status: int
    headers: httpx.Headers
    chunks: list[tuple[float, bytes]]  # (arrival time, bytes of one read) in order

    @property
    def body(self) -> bytes:
        return b"".join(chunk for _, chunk in self.chunks)

    def events(self) -> list[str]:
        """The SSE data fields, in order."""
        frames = self.body.decode().split("\n\n")
        return [frame.removeprefix("data: ") for frame in frames if frame.startswith("data: ")]


def stream(url: str, body: dict, headers: dict[str, str] | None = None) -> Streamed:
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as reply:
        chunks = [(time.monotonic(), chunk) for chunk in reply.iter_raw()]
        return Streamed(reply.status_code, reply.headers, chunks)


def normalized(event: str) -> object:
    """An SSE event with the per-request fields removed; [DONE] stays as it is."""
    if event == "[DONE]":
        return event
    data = json.loads(event)
    return {k: v for k, v in data.items() if k not in PER_REQUEST}


def without_timings(reply: dict) -> dict:
    usage = {k: v for k, v in reply.get("usage", {}).items() if k != "mstar_timings"}
    return {**{k: v for k, v in reply.items() if k not in PER_REQUEST}, "usage": usage}


def served(pod: Stack, surface: str) -> float:
    """Requests pod's preprocess ended on `surface` (its Prometheus counter)."""
    text = httpx.get(pod.metrics_urls["preprocess"], timeout=5).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "mstar_preprocess_requests"
               for sample in family.samples
               if sample.name == "mstar_preprocess_requests_total" and sample.labels.get("surface") == surface)


def wait_served(pool: Pool, surface: str, before: list[float], expected: list[int], timeout_s: float = 5.0):
    """Per-pod request counts since `before`, once they equal `expected` or at the timeout (a
    request is counted as its stream ends, which may trail the reply's last byte a little)."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = [int(served(pod, surface) - b) for pod, b in zip(pool.pods, before, strict=True)]
        if counts == expected or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def pick(i: int) -> dict[str, str]:
    return {PICK_HEADER: str(i)}


def test_gateway_config_is_what_gie_gateways_run(pool):
    """The routing pieces are really in the running gateway (not a plain proxy that happens to work)."""
    dump = httpx.get(pool.gateway.admin_url + "/config_dump", timeout=5).text
    assert "envoy.filters.http.ext_proc" in dump and '"ORIGINAL_DST"' in dump
    assert f'"http_header_name": "{DESTINATION_HEADER}"' in dump


def test_sse_stream_arrives_intact_and_incrementally(pool):
    body = {**CHAT, "stream": True}
    pool.picker.reset()
    direct = stream(pool.pods[1].http_url + "/v1/chat/completions", body)
    routed = stream(pool.gateway.http_url + "/v1/chat/completions", body, pick(1))
    assert pool.picker.choices == [("/v1/chat/completions", pool.endpoint(1))]
    assert direct.status == routed.status == 200, routed.body
    assert routed.headers["content-type"] == direct.headers["content-type"] == "text/event-stream"
    assert DESTINATION_HEADER not in routed.headers  # the routing header stays inside the gateway
    events = routed.events()
    assert events[-1] == "[DONE]" and routed.body.endswith(b"data: [DONE]\n\n")
    # The same sequence of events as the pod itself sends (first delta carries the role, the last
    # one the finish reason), once the per-request id and timestamp are set aside.
    assert [normalized(e) for e in events] == [normalized(e) for e in direct.events()]
    assert len(events) == CHAT["max_tokens"] + 2  # one per token, the finish, [DONE]
    # Incremental: read in several parts, the first long before the last (the engine needs
    # STEP_MS per token, so a buffering proxy would deliver it all at the end in one read).
    arrivals = [t for t, _ in routed.chunks]
    assert len(arrivals) > 1, routed.chunks
    assert arrivals[-1] - arrivals[0] >= (CHAT["max_tokens"] - 3) * STEP_MS / 1000, arrivals
    first = routed.chunks[0][1].decode()
    assert first.startswith("data: ") and "[DONE]" not in first


def test_openai_sdk_streams_through_the_gateway(pool):
    client = openai.OpenAI(base_url=pool.gateway.http_url + "/v1", api_key="unused",
                           default_headers=pick(0), max_retries=0)
    direct = openai.OpenAI(base_url=pool.pods[0].http_url + "/v1", api_key="unused", max_retries=0)

    def text(c: openai.OpenAI) -> str:
        chunks = c.chat.completions.create(**CHAT, stream=True)
        return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

    routed_text, direct_text = text(client), text(direct)
    assert routed_text == direct_text and len(routed_text) == CHAT["max_tokens"]


def test_each_request_reaches_the_pod_the_picker_chose(pool):
    picks = [0, 1, 1, 0, 1, 1]
    before = [served(pod, "completions") for pod in pool.pods]
    pool.picker.reset()
    for i in picks:
        reply = httpx.post(pool.gateway.http_url + "/v1/completions", json=COMPLETION, headers=pick(i), timeout=30)
        assert reply.status_code == 200, reply.text
    # A client naming its own destination is overruled: the picker replaces the header (a picker
    # that appended would lose: ORIGINAL_DST takes the first value, the client's).
    spoofed = {**pick(1), DESTINATION_HEADER: pool.endpoint(0)}
    assert httpx.post(pool.gateway.http_url + "/v1/completions", json=COMPLETION, headers=spoofed,
                      timeout=30).status_code == 200
    picks.append(1)
    assert pool.picker.choices == [("/v1/completions", pool.endpoint(i)) for i in picks]
    assert wait_served(pool, "completions", before, [picks.count(0), picks.count(1)]) == [2, 5]


def test_round_robin_without_a_pick_header_spreads_over_the_pods(pool):
    # The picker's default rule, as GIE's lightweight EPP does: alternate over its endpoints. The
    # dead one is in the list too, so only count the ones that landed on a pod.
    before = [served(pod, "completions") for pod in pool.pods]
    pool.picker.reset()
    statuses = [httpx.post(pool.gateway.http_url + "/v1/completions", json=COMPLETION, timeout=30).status_code
                for _ in range(3)]
    chosen = [endpoint for _, endpoint in pool.picker.choices]
    assert sorted(chosen) == sorted([pool.endpoint(0), pool.endpoint(1), pool.dead])
    assert statuses.count(200) == 2 and statuses.count(503) == 1
    assert wait_served(pool, "completions", before, [1, 1]) == [1, 1]


def test_non_streamed_reply_passes_unchanged(pool):
    direct = httpx.post(pool.pods[0].http_url + "/v1/completions", json=COMPLETION, timeout=30)
    routed = httpx.post(pool.gateway.http_url + "/v1/completions", json=COMPLETION, headers=pick(0), timeout=30)
    assert direct.status_code == routed.status_code == 200, routed.text
    assert routed.headers["content-type"] == "application/json"
    assert without_timings(routed.json()) == without_timings(direct.json())
    assert routed.json()["object"] == "text_completion" and routed.json()["usage"]["completion_tokens"] == 3
    # The pod's per-request timing headers reach the client too.
    assert {h for h in routed.headers if h.startswith("x-mstar-")} == {h for h in direct.headers if h.startswith("x-mstar-")}
    assert float(routed.headers["x-mstar-e2e-ms"]) > 0


@pytest.mark.parametrize("content, param", [(b"{oops", "body"), (json.dumps({**CHAT, "max_tokens": "8"}).encode(), "max_tokens")])
def test_openai_errors_pass_unchanged(pool, content, param):
    headers = {"content-type": "application/json"}
    direct = httpx.post(pool.pods[1].http_url + "/v1/chat/completions", content=content, headers=headers, timeout=30)
    routed = httpx.post(pool.gateway.http_url + "/v1/chat/completions", content=content,
                        headers={**headers, **pick(1)}, timeout=30)
    assert direct.status_code == routed.status_code == 400, routed.text
    assert routed.headers["content-type"] == "application/json"
    assert routed.content == direct.content  # byte for byte: the gateway adds nothing, reshapes nothing
    error = routed.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.mark.parametrize("streamed", [False, True])
def test_a_picked_pod_that_is_down_is_a_quick_503(pool, streamed):
    pool.picker.reset()
    t0 = time.monotonic()
    reply = httpx.post(pool.gateway.http_url + "/v1/chat/completions", json={**CHAT, "stream": streamed},
                       headers=pick(2), timeout=10)
    elapsed = time.monotonic() - t0
    assert pool.picker.choices == [("/v1/chat/completions", pool.dead)]
    assert reply.status_code == 503, reply.text
    # Envoy's own local reply (no pod ever answered): plain text, before any stream began.
    assert reply.headers["content-type"] == "text/plain"
    assert reply.text.startswith("upstream connect error or disconnect/reset before headers")
    assert "remote connection failure" in reply.text
    assert elapsed < 2.0, elapsed  # refused at once (measured ~0.05 s), not a hang


def test_an_unreachable_picker_fails_closed(tmp_path):
    # failure_mode_allow: false: with no answer from the picker Envoy does not guess a pod.
    gateway = Gateway.start(free_port(), tmp_path)  # nothing listens on the picker's port
    try:
        t0 = time.monotonic()
        reply = httpx.post(gateway.http_url + "/v1/chat/completions", json=CHAT, timeout=10)
        assert reply.status_code == 500 and reply.content == b"", reply.text
        assert time.monotonic() - t0 < 3.0
    finally:
        gateway.stop()
