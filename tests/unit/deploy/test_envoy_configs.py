"""Every Envoy config the project ships passes `envoy --mode validate`, and the committed copies
(compose, k8s) are exactly what the renderer produces from the template."""

import dataclasses
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.envoy import render
from services.stack.envoy import envoy_binary

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"


@pytest.mark.parametrize("variant", sorted(render.VARIANTS))
def test_variant_passes_envoy_validate(variant, tmp_path):
    # Container variants point at /etc/envoy/descriptor.pb; validate against the local build of it.
    settings = dataclasses.replace(render.VARIANTS[variant], descriptor_path=str(render.DEFAULT_DESCRIPTOR))
    config = render.write(settings, tmp_path / "envoy.yaml")
    result = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(config), "--use-dynamic-base-id"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "OK" in result.stdout + result.stderr


@pytest.mark.parametrize("variant", sorted(render.COMMITTED))
def test_committed_copies_match_the_template(variant):
    assert render.COMMITTED[variant].read_text() == render.render(render.VARIANTS[variant]), (
        "stale: run `python -m deploy.envoy.render --write-committed`")


@pytest.mark.parametrize("variant", sorted(render.VARIANTS))
def test_admin_is_loopback_only_and_upstream_resolves_by_dns_in_containers(variant):
    config = yaml.safe_load(render.render(render.VARIANTS[variant]))
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    cluster = config["static_resources"]["clusters"][0]
    assert cluster["common_lb_config"]["healthy_panic_threshold"]["value"] == 0
    # STATIC where the upstream is on loopback: local processes, or the preprocess beside Envoy in
    # an InferencePool pod (variant pod).
    assert cluster["type"] == ("STATIC" if variant in ("local", "pod") else "STRICT_DNS")


def test_streaming_routes_have_no_route_timeout_but_idle_and_duration_bounds():
    config = yaml.safe_load(render.render(render.VARIANTS["local"]))
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["request_headers_timeout"] and hcm["stream_idle_timeout"]
    routes = {r["match"].get("path"): r["route"] for r in hcm["route_config"]["virtual_hosts"][0]["routes"]
              if "route" in r}  # direct responses (the 415 for non-JSON bodies) forward nothing
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/generate_stream", "/v1/generate", "/v1/session"):
        assert routes[path]["timeout"] == "0s"
        assert routes[path]["idle_timeout"] and routes[path]["max_stream_duration"]["max_stream_duration"]
    names = [f["name"] for f in hcm["http_filters"]]
    # header_mutation before the transcoder: it strips grpc-* headers AFTER the transcoder mapped them.
    assert names.index("envoy.filters.http.header_mutation") < names.index("envoy.filters.http.grpc_json_transcoder")
    assert names[-1] == "envoy.filters.http.router"


def test_compose_and_k8s_reference_files_that_exist():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for service in compose["services"].values():
        assert (ROOT / service["build"]["dockerfile"]).is_file()
    assert "envoyproxy/envoy:v1.40" in (DEPLOY / "docker/envoy.Dockerfile").read_text()
    kustomization = yaml.safe_load((DEPLOY / "k8s/kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        docs = list(yaml.safe_load_all((DEPLOY / "k8s" / resource).read_text()))
        assert all(doc["kind"] and doc["metadata"]["name"] for doc in docs)
    for generator in kustomization["configMapGenerator"]:
        for entry in generator["files"]:
            assert (DEPLOY / "k8s" / entry.split("=")[-1]).is_file()


def test_probes_and_restart_policies_let_orchestrators_heal_the_services():
    # Readiness follows the serving state; liveness must not restart a process that only waits for
    # its backend (the "liveness" health name is NOT_SERVING only when FAILED).
    for name, port in (("generation", 50052), ("preprocess", 50051)):
        pod = yaml.safe_load((DEPLOY / "k8s" / f"{name}.yaml").read_text().split("\n---")[0])["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["readinessProbe"]["grpc"] == {"port": port}
        assert container["livenessProbe"]["grpc"] == {"port": port, "service": "liveness"}
        assert container["startupProbe"]["grpc"] == {"port": port}
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert all(service["restart"] == "unless-stopped" for service in compose["services"].values())


@pytest.mark.parametrize("variant", sorted(render.VARIANTS))
def test_every_preprocess_replica_is_an_endpoint_balanced_by_least_request(variant):
    settings = dataclasses.replace(render.VARIANTS[variant], upstream_ports=(50051, 50053, 50055))
    config = yaml.safe_load(render.render(settings))
    cluster = config["static_resources"]["clusters"][0]
    assert cluster["lb_policy"] == "LEAST_REQUEST"
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
             for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == [50051, 50053, 50055]
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert "mstar-forwarded" in hcm["route_config"]["request_headers_to_remove"]
    retry = hcm["route_config"]["virtual_hosts"][0]["retry_policy"]
    # Only what cannot have started anything: never "reset" or "unavailable" (R28).
    assert set(retry["retry_on"].split(",")) == {"connect-failure", "refused-stream", "retriable-headers"}
    assert retry["retriable_headers"] == [{"name": "x-mstar-refused", "present_match": True}]
    outliers = cluster["outlier_detection"]  # a replica that refuses connections is out at once ...
    assert outliers["consecutive_local_origin_failure"] == 1 and outliers["split_external_local_origin_errors"]
    assert outliers["enforcing_consecutive_5xx"] == outliers["enforcing_success_rate"] == 0  # ... answers never
    health = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.health_check")
    assert health["typed_config"]["cluster_min_healthy_percentages"]["preprocess"]["value"] >= 1


def test_compose_services_scale():
    """No fixed names or host ports on the services, so `--scale`/replicas can run several; each
    replica finds the others by the service name (compose DNS answers with every replica)."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    for name in ("generation", "preprocess"):
        assert "container_name" not in compose[name] and "ports" not in compose[name]
        assert compose[name]["deploy"]["replicas"].startswith(f"${{MSTAR_{name.upper()}_REPLICAS:-")
    command = compose["preprocess"]["command"]
    assert command[command.index("--generation") + 1] == "generation:50052"
    assert command[command.index("--peers") + 1] == "preprocess:50051"
    assert render.VARIANTS["compose"].upstream_host == "preprocess"


def test_local_replies_carry_the_grpc_code_whose_status_they_have():
    """An Envoy local reply and a transcoded error with the same HTTP status name the same gRPC
    code, read from the one gRPC -> HTTP table (services/common/errors.py)."""
    from services.common.errors import HTTP_STATUS, Code

    codes = render.local_reply_grpc_codes()
    for status, code in codes.items():
        if status not in render.ENVOY_ONLY_STATUS_CODES:
            assert HTTP_STATUS[Code(code)] == status
    assert set(codes) >= {s for s in HTTP_STATUS.values() if s >= 400} and codes[500] == Code.INTERNAL
