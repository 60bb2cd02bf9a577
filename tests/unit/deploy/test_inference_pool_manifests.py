"""deploy/k8s/inference-pool (mstar as a Gateway API Inference Extension InferencePool) validates
offline: its core kinds as deploy/k8s's do (kubernetes-validate, strict, the same versions), its CRD
kinds (InferencePool, Gateway, HTTPRoute) against the vendored CRDs' openAPIV3Schema with unknown
fields refused, the EPP's config against the keys of its v1.5.0 Go types; and what must agree
across the files does: selectors, ports, names, flags, drain timing, routes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry
from test_k8s_manifests import MARGIN_S, VERSIONS, flag, service_args

from deploy.envoy import render
from services.common.model_server_metrics import ModelServerGauges

ROOT = Path(__file__).resolve().parents[3]
POOL = ROOT / "deploy" / "k8s" / "inference-pool"
CRDS = {  # the kinds kubernetes-validate has no schema for -> their vendored CRD
    ("inference.networking.k8s.io", "InferencePool"):
        "gateway-api-inference-extension/inference.networking.k8s.io_inferencepools.yaml",
    ("gateway.networking.k8s.io", "Gateway"): "gateway-api/gateway.networking.k8s.io_gateways.yaml",
    ("gateway.networking.k8s.io", "HTTPRoute"): "gateway-api/gateway.networking.k8s.io_httproutes.yaml",
}
# EPP v1.5.0's flags (pkg/epp/server/options.go, pkg/common/observability/logging and
# controller-runtime's zap flags at gateway-api-inference-extension v1.5.0): name -> takes a value.
EPP_BOOL_FLAGS = {"ha-enable-leader-election", "disable-endpoint-subset-filter", "tracing", "health-checking",
                  "model-server-metrics-https-insecure-skip-verify", "enable-pprof", "enable-cert-reload",
                  "secure-serving", "metrics-endpoint-auth", "zap-devel"}
EPP_VALUE_FLAGS = {"grpc-port", "pool-group", "pool-namespace", "pool-name", "endpoint-selector", "endpoint-target-ports",
                   "model-server-metrics-scheme", "model-server-metrics-path", "model-server-metrics-port",
                   "refresh-metrics-interval", "refresh-prometheus-metrics-interval", "metrics-staleness-threshold",
                   "v", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding", "metrics-port",
                   "grpc-health-port", "cert-path", "config-file", "config-text"}
# v1.5.0 refuses to start when one of these is set (options.go Validate: "use engineConfigs").
EPP_REFUSED_FLAGS = {"total-queued-requests-metric", "total-running-requests-metric",
                     "kv-cache-usage-percentage-metric", "lora-info-metric", "cache-info-metric"}
# EndpointPickerConfig's JSON keys (apix/config/v1alpha1/endpointpickerconfig_types.go, v1.5.0),
# which the EPP decodes strictly; and the parameters of the plugins we configure, which it does
# NOT (json.Unmarshal ignores unknown keys): a misspelt parameter would silently be a default.
CONFIG_KEYS = {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles", "saturationDetector",
               "dataLayer", "flowControl", "parser"}
PLUGIN_PARAMETERS = {
    "prefix-cache-scorer": {"autoTune", "blockSizeTokens", "blockSize", "maxPrefixBlocksToMatch",
                            "maxPrefixTokensToMatch", "lruCapacityPerServer"},
    "metrics-data-source": {"scheme", "path", "insecureSkipVerify"},
    "core-metrics-extractor": {"engineLabelKey", "defaultEngine", "engineConfigs"},
    "max-score-picker": {"maxNumOfEndpoints"},
}
ENGINE_CONFIG_KEYS = {"name", "queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheInfoSpec",
                      "cacheBlockSizeLabelName", "cacheNumBlocksLabelName", "cacheBlockSizeSpec", "cacheNumBlocksSpec"}
# The paths whose bodies the EPP's openai-parser reads (it matches these suffixes).
OPENAI_PARSED = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"}


def everything() -> list[dict]:
    """Every resource the folder's kustomization makes, the generated ConfigMaps as it makes them."""
    kustomization = yaml.safe_load((POOL / "kustomization.yaml").read_text())
    found = [d for name in kustomization["resources"] for d in yaml.safe_load_all((POOL / name).read_text()) if d]
    for generator in kustomization["configMapGenerator"]:
        data = {}
        for entry in generator["files"]:  # "key=file", or "file" (its name is the key)
            key, _, file = entry.rpartition("=")
            data[key or Path(file).name] = (POOL / file).read_text()
        found.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data})
    return found


def group(doc: dict) -> str:
    return doc["apiVersion"].rpartition("/")[0]


def one(kind: str, name: str) -> dict:
    (doc,) = [d for d in everything() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def containers(name: str) -> dict[str, dict]:
    return {c["name"]: c for c in one("Deployment", name)["spec"]["template"]["spec"]["containers"]}


def port(container: dict, name: str) -> int:
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


def epp_flags() -> dict[str, str]:
    """The EPP's command line as pflag reads it: --name value, --name=value, a bare bool."""
    args, found = iter(containers("mstar-epp")["epp"]["args"]), {}
    for arg in args:
        assert arg.startswith("--"), arg
        name, eq, value = arg[2:].partition("=")
        found[name] = value if eq else "true" if name in EPP_BOOL_FLAGS else next(args)
    return found


def pod_envoy() -> dict:
    return yaml.safe_load(one("ConfigMap", "mstar-pool-envoy-config")["data"]["envoy.yaml"])


def epp_config() -> dict:
    return yaml.safe_load(one("ConfigMap", "mstar-epp-config")["data"]["epp-config.yaml"])


def strict(schema):
    """A CRD schema that refuses unknown fields, as a strict `kubectl apply` does (the API server
    prunes or rejects what the schema does not name; plain JSON Schema would accept it)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (out.get("type") == "object" and isinstance(out.get("properties"), dict) and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def crd_validator(doc: dict) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((ROOT / "third_party" / CRDS[(group(doc), doc["kind"])]).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == doc["apiVersion"].rpartition("/")[2]]
    assert version["served"], f"{doc['apiVersion']} {doc['kind']} is not served by the vendored CRD"
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def seconds(duration: str) -> float:
    """A Gateway API / Envoy duration ("1800s", "30m", "1h30m", "500ms") in seconds."""
    assert re.fullmatch(r"([0-9]+(h|ms|m|s))+", duration), duration
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)(h|ms|m|s)", duration))


@pytest.mark.parametrize("version", VERSIONS)
def test_core_kinds_validate_strictly(version):
    core = [d for d in everything() if (group(d), d["kind"]) not in CRDS]
    assert {d["kind"] for d in core} >= {"Deployment", "Service", "ConfigMap", "Role", "RoleBinding"}
    for doc in core:
        kubernetes_validate.validate(doc, version, strict=True)  # raises with the offending field


def test_crd_kinds_validate_against_the_vendored_crds():
    custom = [d for d in everything() if (group(d), d["kind"]) in CRDS]
    assert sorted(d["kind"] for d in custom) == ["Gateway", "HTTPRoute", "InferencePool"]
    for doc in custom:
        crd_validator(doc).validate(doc)
        # The CRDs leave metadata to the API server: the core ObjectMeta schema, strictly.
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
                                     VERSIONS[-1], strict=True)


def test_the_crd_validation_refuses_what_a_cluster_would():
    pool = one("InferencePool", "mstar-pool")
    validator = crd_validator(pool)
    for broken in ({**pool["spec"], "targetPort": 8080}, {**pool["spec"], "targetPorts": [{"number": 0}]},
                   {k: v for k, v in pool["spec"].items() if k != "selector"}):
        assert list(validator.iter_errors({**pool, "spec": broken})), broken


def test_the_kustomization_lists_every_manifest_and_generates_the_configs():
    kustomization = yaml.safe_load((POOL / "kustomization.yaml").read_text())
    generated = {e.rpartition("=")[2] for g in kustomization["configMapGenerator"] for e in g["files"]}
    assert set(kustomization["resources"]) == {p.name for p in POOL.glob("*.yaml")} - {"kustomization.yaml"} - generated
    assert render.COMMITTED["pod"] == POOL / "envoy-config.yaml"  # kept current by test_envoy_configs.py
    listed = yaml.safe_load((POOL.parent / "kustomization.yaml").read_text())["resources"]
    assert not any("inference-pool" in r for r in listed)  # its own deployment: `apply -k deploy/k8s` leaves it out


@pytest.mark.parametrize("deployment, config_flag", [("mstar-pool", "-c"), ("mstar-epp", "--config-file")])
def test_each_config_file_is_the_generated_configmap_where_the_process_reads_it(deployment, config_flag):
    pod = one("Deployment", deployment)["spec"]["template"]["spec"]
    (volume,) = pod["volumes"]
    (reader,) = [c for c in pod["containers"] if c.get("volumeMounts")]
    (mount,) = reader["volumeMounts"]
    assert mount["name"] == volume["name"]
    path = Path(flag(reader["args"], config_flag))
    assert path.parent == Path(mount["mountPath"])
    assert path.name in one("ConfigMap", volume["configMap"]["name"])["data"]


def test_the_pool_selects_the_model_server_pods_at_envoys_port():
    pool = one("InferencePool", "mstar-pool")["spec"]
    selector = pool["selector"]["matchLabels"]
    for deployment in (d for d in everything() if d["kind"] == "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert (selector.items() <= labels.items()) == (deployment["metadata"]["name"] == "mstar-pool")
    envoy = containers("mstar-pool")["envoy"]
    assert [p["number"] for p in pool["targetPorts"]] == [port(envoy, "http")]
    config = pod_envoy()
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listener == {"address": "0.0.0.0", "port_value": port(envoy, "http")}
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "preprocess"]
    (upstream,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    preprocess = service_args("preprocess", containers("mstar-pool")["preprocess"]["args"])
    assert upstream["endpoint"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": preprocess.port}


def test_the_pool_names_the_epp_service_and_the_epp_names_the_pool():
    pool = one("InferencePool", "mstar-pool")
    ref = pool["spec"]["endpointPickerRef"]
    # The CRD's CEL rule, which jsonschema cannot run: a Service reference needs its port.
    assert ref.get("kind", "Service") == "Service" and ref.get("group", "") == "" and "port" in ref
    service = one("Service", ref["name"])
    (ext_proc,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    epp, epp_pod = containers("mstar-epp")["epp"], one("Deployment", "mstar-epp")["spec"]["template"]
    assert service["spec"]["selector"].items() <= epp_pod["metadata"]["labels"].items()
    flags = epp_flags()
    assert int(flags["grpc-port"]) == port(epp, ext_proc["targetPort"])
    assert int(flags["grpc-health-port"]) == epp["readinessProbe"]["grpc"]["port"] == epp["livenessProbe"]["grpc"]["port"]
    assert int(flags["metrics-port"]) == port(epp, "metrics")
    assert (flags["pool-name"], flags["pool-group"]) == (pool["metadata"]["name"], group(pool))
    assert "pool-namespace" not in flags  # so the EPP takes the pool's namespace from NAMESPACE, its own
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in epp["env"]}
    assert env["NAMESPACE"] == "metadata.namespace"


def test_the_epp_flags_exist_in_v1_5_0_and_scrape_the_engines_metrics_port():
    flags = epp_flags()
    assert containers("mstar-epp")["epp"]["image"] == "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    assert set(flags) <= EPP_BOOL_FLAGS | EPP_VALUE_FLAGS, set(flags) - EPP_BOOL_FLAGS - EPP_VALUE_FLAGS
    assert not set(flags) & EPP_REFUSED_FLAGS
    generation = containers("mstar-pool")["generation"]
    metrics_port = service_args("generation", generation["args"]).metrics_port
    assert int(flags["model-server-metrics-port"]) == metrics_port == port(generation, "metrics")
    # v1.5.0 applies the flag only to a pool with one target port (else it scrapes each target port).
    assert len(one("InferencePool", "mstar-pool")["spec"]["targetPorts"]) == 1
    annotations = one("Deployment", "mstar-pool")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(metrics_port)


def test_the_epp_config_has_upstreams_structure_and_every_reference_resolves():
    config = epp_config()
    assert set(config) <= CONFIG_KEYS and {"plugins", "schedulingProfiles"} <= set(config)
    assert (config["apiVersion"], config["kind"]) == ("inference.networking.x-k8s.io/v1alpha1", "EndpointPickerConfig")
    plugins = {}
    for spec in config["plugins"]:
        assert set(spec) <= {"name", "type", "parameters"} and spec["type"], spec
        name = spec.get("name") or spec["type"]  # the EPP names an unnamed plugin by its type
        assert name not in plugins, f"duplicate plugin name {name}"
        plugins[name] = spec
        assert set(spec.get("parameters") or {}) <= PLUGIN_PARAMETERS.get(spec["type"], set()), spec
    referenced = set()
    for profile in config["schedulingProfiles"]:
        assert set(profile) == {"name", "plugins"} and profile["name"]
        for ref in profile["plugins"]:
            assert set(ref) <= {"pluginRef", "weight"}
            referenced.add(ref["pluginRef"])
    for source in config.get("dataLayer", {}).get("sources", []):
        assert set(source) == {"pluginRef", "extractors"}
        referenced |= {source["pluginRef"]} | {e["pluginRef"] for e in source["extractors"]}
    referenced |= {config["parser"]["pluginRef"]} if "parser" in config else set()
    assert referenced <= set(plugins), referenced - set(plugins)  # the EPP refuses an undefined reference
    # A profile handler is used by the scheduler itself, never listed in a profile.
    unused = {n for n, s in plugins.items() if s["type"] != "single-profile-handler"} - referenced
    assert not unused, f"configured but never used: {unused}"


def test_the_epp_scores_queue_kv_and_prefix_from_the_engines_vllm_gauges():
    config = epp_config()
    types = {p.get("name") or p["type"]: p for p in config["plugins"]}
    (profile,) = config["schedulingProfiles"]
    assert {types[r["pluginRef"]]["type"] for r in profile["plugins"]} == {
        "queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "max-score-picker"}
    prefix = types["prefix-cache-scorer"]["parameters"]
    engine = service_args("generation", containers("mstar-pool")["generation"]["args"])
    assert prefix["blockSizeTokens"] == engine.block_size  # until autoTune reads cache_config_info
    extractor = types["core-metrics-extractor"]["parameters"]
    (mapping,) = [e for e in extractor["engineConfigs"] if e["name"] == extractor["defaultEngine"]]
    assert set(mapping) <= ENGINE_CONFIG_KEYS
    # The series generation's metrics port serves (services/common/model_server_metrics.py), each
    # for what the EPP takes it to mean; the cache shape in the labels the extractor reads.
    gauges = ModelServerGauges(registry := CollectorRegistry(), "default")
    gauges.describe_cache(engine.block_size, 1024)
    assert [mapping[k] for k in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec")] == [
        g.describe()[0].name for g in (gauges.waiting, gauges.running, gauges.kv_usage, gauges.cache_info)]
    (info,) = gauges.cache_info.collect()[0].samples
    assert info.labels == {"block_size": str(engine.block_size), "num_gpu_blocks": "1024"}
    # No adapters, no series: the EPP must not look for one.
    assert mapping["loraSpec"] == "" and "vllm:lora_requests_info" not in {f.name for f in registry.collect()}


def test_the_pods_run_the_plain_deployments_containers():
    """Same images, probes, resources, users and flags as deploy/k8s's Deployments, but for the
    upstreams: preprocess's engine is the one beside it, its peers the pool's pods."""
    pool = containers("mstar-pool")
    for name in ("generation", "preprocess", "envoy"):
        plain = yaml.safe_load((POOL.parent / f"{name}.yaml").read_text().split("\n---")[0])["spec"]["template"]
        (mine, theirs) = pool[name], plain["spec"]["containers"][0]
        for key in ("image", "ports", "resources", "startupProbe", "readinessProbe", "livenessProbe"):
            assert mine.get(key) == theirs.get(key), (name, key)
        assert mine["securityContext"] == {**theirs["securityContext"],
                                           "runAsUser": plain["spec"]["securityContext"]["runAsUser"]}
        differs = {"--generation", "--peers"} if name == "preprocess" else set()
        assert [a for i, a in enumerate(mine["args"]) if i == 0 or mine["args"][i - 1] not in differs] == [
            a for i, a in enumerate(theirs["args"]) if i == 0 or theirs["args"][i - 1] not in differs], name


def test_preprocess_uses_the_engine_beside_it_and_finds_every_peer():
    pool = containers("mstar-pool")
    preprocess = service_args("preprocess", pool["preprocess"]["args"])
    generation = service_args("generation", pool["generation"]["args"])
    assert preprocess.generation == f"127.0.0.1:{generation.port}"  # a literal IP: exactly one replica
    peers_host, peers_port = preprocess.peers.split(":")
    peers = one("Service", peers_host)["spec"]
    assert peers["clusterIP"] == "None" and peers["publishNotReadyAddresses"] is True
    assert peers["ports"][0]["port"] == int(peers_port) == preprocess.port
    assert preprocess.advertise == f"$(POD_IP):{preprocess.port}"
    labels = one("Deployment", "mstar-pool")["spec"]["template"]["metadata"]["labels"]
    for name in ("mstar-pool-peers", "mstar-pool-direct"):
        service = one("Service", name)["spec"]
        assert service["selector"].items() <= labels.items()
        for p in service["ports"]:  # a named targetPort must be some container's port
            assert any(p["targetPort"] == q["name"] for c in pool.values() for q in c["ports"])
    assert one("PodDisruptionBudget", "mstar-pool")["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_drain_is_ordered_inside_the_pod():
    deployment = one("Deployment", "mstar-pool")
    pool = containers("mstar-pool")
    pre_stop = {n: c["lifecycle"]["preStop"]["sleep"]["seconds"] for n, c in pool.items()}
    preprocess = service_args("preprocess", pool["preprocess"]["args"])
    generation = service_args("generation", pool["generation"]["args"])
    accepting_until = pre_stop["preprocess"] + preprocess.drain_accept_s
    # The engine drains only after preprocess stopped taking requests; Envoy stops only after
    # every request preprocess still runs has ended, and the engine's too.
    assert pre_stop["generation"] >= accepting_until
    assert pre_stop["envoy"] >= accepting_until + preprocess.grace_s
    assert pre_stop["envoy"] >= pre_stop["generation"] + generation.grace_s
    drain = float(flag(pool["envoy"]["args"], "--drain-time-s"))
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= pre_stop["envoy"] + drain + MARGIN_S
    epp = one("Deployment", "mstar-epp")["spec"]["template"]["spec"]
    assert epp["terminationGracePeriodSeconds"] >= grace  # upstream: the picker outlives the pool's pods
    assert deployment["spec"]["replicas"] >= 2  # a budget on one replica would block every node drain


def envoy_routes() -> list[dict]:
    hcm = pod_envoy()["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return [r for r in hcm["route_config"]["virtual_hosts"][0]["routes"] if "route" in r]


def served_by_a_named_route(path: str) -> bool:
    """Whether one of the pod Envoy's forwarding routes names this path, not only a catch-all
    (a route that also takes a path no API has is a catch-all)."""
    def matches(match: dict, p: str) -> bool:
        if "safe_regex" in match:
            return re.fullmatch(match["safe_regex"]["regex"], p) is not None
        return p == match["path"] if "path" in match else p.startswith(match["prefix"])
    return any(matches(r["match"], path) and not matches(r["match"], "/v1/zz-no-such-api")
               for r in envoy_routes())


def test_the_route_sends_openai_bodies_to_the_pool_and_the_rest_to_the_pods_directly():
    route = one("HTTPRoute", "mstar")["spec"]
    assert [(p["kind"], p["name"]) for p in route["parentRefs"]] == [("Gateway", "mstar-gateway")]
    assert one("Gateway", "mstar-gateway")["spec"]["listeners"]
    to_pool = [r for r in route["rules"] if r["backendRefs"][0].get("kind") == "InferencePool"]
    direct = [r for r in route["rules"] if r["backendRefs"][0].get("kind") == "Service"]
    assert len(to_pool) == len(direct) == 1 and len(route["rules"]) == 2
    (pool_ref,) = to_pool[0]["backendRefs"]
    assert (pool_ref["group"], pool_ref["name"]) == (group(one("InferencePool", "mstar-pool")), "mstar-pool")
    pool_paths = {(m["path"]["type"], m["path"]["value"]) for m in to_pool[0]["matches"]}
    assert pool_paths == {("Exact", p) for p in OPENAI_PARSED} | {("PathPrefix", "/")}
    (service_ref,) = direct[0]["backendRefs"]
    service = one("Service", service_ref["name"])["spec"]
    assert service_ref["port"] in [p["port"] for p in service["ports"]]
    assert service["selector"] == one("InferencePool", "mstar-pool")["spec"]["selector"]["matchLabels"]
    for match in direct[0]["matches"]:
        value = match["path"]["value"]
        if match.get("headers"):  # gRPC on any path, by content type
            assert value == "/" and match["headers"][0]["name"] == "content-type"
            continue
        exact = match["path"]["type"] == "Exact"
        assert not (exact and value in OPENAI_PARSED)  # an OpenAI path's Exact match wins over prefixes
        assert served_by_a_named_route(value if exact else value + "/x"), f"the pod's Envoy serves no {value}"
    assert all(served_by_a_named_route(path) for path in OPENAI_PARSED)
    # A whole stream is one Gateway request: it may last as long as mstar's Envoy lets it.
    longest = seconds(render.VARIANTS["pod"].max_stream_duration)
    assert all(seconds(rule["timeouts"]["request"]) >= longest for rule in route["rules"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its kustomize) not installed")
def test_kustomize_builds_it():
    built = subprocess.run(["kubectl", "kustomize", str(POOL)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-2000:]
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    assert {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] != "ConfigMap"} == {
        (d["kind"], d["metadata"]["name"]) for d in everything() if d["kind"] != "ConfigMap"}
    assert all(d["metadata"].get("namespace") == "mstar" for d in docs if d["kind"] != "Namespace")
