"""R28–R29: nothing that may have started is retried behind the client's back, and a long silent prefill is kept alive
by heartbeats instead of being killed by an idle timeout."""

from __future__ import annotations

import httpx
import pytest
import yaml

from deploy.envoy.render import VARIANTS, render
from tests.reliability import probe
from tests.reliability.edge import edge

pytestmark = pytest.mark.reliability


def test_r28_envoy_replays_only_what_did_not_start(tmp_path):
    """Envoy retries only requests that provably never started: not delivered (connect failure,
    REFUSED_STREAM) or refused by a replica before anything ran (the x-mstar-refused trailer of
    a draining replica; tests/unit/deploy/test_envoy_replicas.py). Any other UNAVAILABLE reaches
    the upstream exactly once: the client alone decides (the contract's retry rules) whether
    running it again is safe."""
    for variant in VARIANTS.values():
        config = yaml.safe_load(render(variant))
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        policies = [hcm["route_config"]["virtual_hosts"][0]["retry_policy"]]
        policies += [r["route"]["retry_policy"] for r in hcm["route_config"]["virtual_hosts"][0]["routes"]
                     if "retry_policy" in r.get("route", {})]
        assert [set(p["retry_on"].split(",")) for p in policies] == [
            {"connect-failure", "refused-stream", "retriable-headers"}]
        assert policies[0]["retriable_headers"] == [{"name": "x-mstar-refused", "present_match": True}]
    with edge(tmp_path) as e, httpx.Client(base_url=e.http_url) as c:
        reply = c.get("/v1/models", headers={"x-test-fail": "unavailable"})
        assert reply.status_code == 503, reply.text
        assert len(e.recorder.metadata) == 1, f"Envoy replayed the request {len(e.recorder.metadata)} times"


@pytest.mark.slow
def test_r29_silent_prefill_survives_short_idle_timeout(make_rig):
    """Envoy's stream idle timeout at 3 s, a prefill of 8 chunked steps at 1 s each (no tokens
    for ~8 s): KeepAlive frames every 2 s keep the SSE stream alive to completion, and health
    stays SERVING throughout."""
    rig = make_rig(generation_args=("--null-step-ms", "1000"), envoy_overrides={"stream_idle_timeout": "3s"})
    body = {"prompt_parts": [{"modality": "MODALITY_TOKENS", "token_ids": {"ids": [100] * 4000}}],
            "model_kwargs": {"sampling": {"max_tokens": 2}}}
    kinds = []
    with httpx.Client(base_url=rig.http, timeout=60) as c, c.stream("POST", "/v1/generate_stream", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                kinds.append(line[len('data: {"'):].split('"', 1)[0])
            assert rig.run(probe.health(rig.generation)) == probe.SERVING
    assert "keep_alive" in kinds and kinds[-1] == "complete", kinds
    assert kinds.count("chunk") >= 1
    rig.check_recovered(timeout_s=30)
