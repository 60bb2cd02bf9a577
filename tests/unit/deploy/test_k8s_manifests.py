"""Every Kubernetes manifest validates offline against the API schemas (kubernetes-validate, strict:
unknown fields are errors) of the oldest supported and the newest Kubernetes version, and the
manifests agree with each other: probes, drain timings, disruption budgets, autoscalers and the
adapter rules that feed them, the headless Services the preprocess flags name."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
# The oldest version the manifests need (native preStop `sleep`: 1.30) and the newest schema known.
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version() + ".0")
MARGIN_S = 5  # what a pod needs after its drain to send the last frames and exit
# Deployments of their own under deploy/k8s, with their own kustomization and test: inference-pool/
# (its CRD kinds have no kubernetes-validate schema; test_inference_pool_manifests.py).
SEPARATE = ("inference-pool",)


def manifests() -> dict[str, list[dict]]:
    """Every resource of this deployment, by file; the Envoy ConfigMap as kustomize generates it."""
    found = {}
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name in ("kustomization.yaml", "envoy-config.yaml"):
            continue
        if path.relative_to(K8S).parts[0] in SEPARATE:
            continue
        found[str(path.relative_to(K8S))] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    found["envoy-config (generated)"] = [{
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "envoy-config", "namespace": "mstar"},
        "data": {"envoy.yaml": (K8S / "envoy-config.yaml").read_text()},
    }]
    return found


def resources(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for docs in manifests().values() for d in docs if d["kind"] == kind}


def container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def service_args(name: str, argv: list[str]):
    """The service's own parse_args over a manifest's command line: every flag must exist."""
    module = __import__(f"services.{name}.__main__", fromlist=["parse_args"])
    assert argv[:3] == ["python", "-m", f"services.{name}"]
    return module.parse_args(argv[3:])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", sorted(manifests()))
def test_every_manifest_validates_strictly(path, version):
    for doc in manifests()[path]:
        kubernetes_validate.validate(doc, version, strict=True)  # raises with the offending field


def test_the_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    top_level = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "envoy-config.yaml"}
    assert listed == top_level  # monitoring/ configures the adapter, outside the mstar namespace


@pytest.mark.parametrize("name", ["generation", "preprocess", "envoy"])
def test_probes_budgets_and_drain_timing(name):
    deployment = resources("Deployment")[name]
    pod = deployment["spec"]["template"]
    c = container(deployment)
    assert c["readinessProbe"] and c["livenessProbe"]
    if name != "envoy":  # the services answer grpc.health.v1 on their gRPC port
        port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
        assert c["readinessProbe"]["grpc"]["port"] == c["livenessProbe"]["grpc"]["port"] == port
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    if name == "envoy":
        drain = float(flag(c["args"], "--drain-time-s"))
    else:  # the service's own defaults when a flag is not given
        args = service_args(name, c["args"])
        drain = args.grace_s + getattr(args, "drain_accept_s", 0.0)
    assert pod["spec"]["terminationGracePeriodSeconds"] >= pre_stop + drain + MARGIN_S
    budget = resources("PodDisruptionBudget")[name]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["replicas"] >= 2  # a budget on one replica would block every node drain


def test_preprocess_finds_every_engine_and_every_peer():
    services = resources("Service")
    args = container(resources("Deployment")["preprocess"])["args"]
    host, port = flag(args, "--generation").split(":")
    assert services[host]["spec"]["clusterIP"] == "None"  # headless: one DNS record per pod
    assert services[host]["spec"]["ports"][0]["port"] == int(port)
    peers_host, peers_port = flag(args, "--peers").split(":")
    assert services[peers_host]["spec"]["clusterIP"] == "None"
    assert services[peers_host]["spec"]["publishNotReadyAddresses"] is True  # draining owners still reachable
    assert flag(args, "--advertise") == f"$(POD_IP):{peers_port}"
    assert services["preprocess"]["spec"]["clusterIP"] == "None"  # Envoy's STRICT_DNS balances per request


@pytest.mark.parametrize("name", ["generation", "preprocess"])
def test_metrics_are_served_where_the_scrape_annotations_point(name):
    deployment = resources("Deployment")[name]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert flag(container(deployment)["args"], "--metrics-port") == annotations["prometheus.io/port"]


def test_every_custom_autoscaling_metric_has_an_adapter_rule():
    adapter = yaml.safe_load(resources("ConfigMap")["prometheus-adapter-mstar"]["data"]["config.yaml"])
    served = {rule["name"]["as"] for rule in adapter["rules"]}
    for hpa in resources("HorizontalPodAutoscaler").values():
        target = hpa["spec"]["scaleTargetRef"]["name"]
        assert target in resources("Deployment")
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "Pods":
                assert metric["pods"]["metric"]["name"] in served
    for rule in adapter["rules"]:  # each rule reads series the engine really exports (docs/metrics.md)
        series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
        assert f"`{series}`" in (K8S.parents[1] / "docs" / "metrics.md").read_text()


def test_compose_command_lines_parse():
    compose = yaml.safe_load((K8S.parent / "compose.yaml").read_text())["services"]
    args = service_args("preprocess", compose["preprocess"]["command"])
    assert args.peers == "preprocess:50051" and args.generation == "generation:50052"
