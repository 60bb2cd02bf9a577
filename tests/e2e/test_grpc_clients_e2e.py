"""gRPC through Envoy's single port: grpcurl (reflection) and a Node.js @grpc/grpc-js client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GRPCURL = str(Path(sys.executable).parent / "grpcurl")
NODE_CACHE = Path(os.environ.get("MSTAR_NODE_CACHE", Path.home() / ".cache" / "mstar" / "node"))
NODE_PACKAGES = ["@grpc/grpc-js@1", "@grpc/proto-loader@0"]
REQUEST = {"input": {"text": "The capital of France is", "model_kwargs": {"sampling": {"max_tokens": 6,
                                                                                       "temperature": 0}}}}


def grpcurl(*args: str) -> str:
    result = subprocess.run([GRPCURL, "-plaintext", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_grpcurl_list_describe_and_stream(stack):
    services = grpcurl(stack.grpc_target, "list").split()
    assert {"mstar.v1.InferenceService", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} \
        <= set(services)
    assert "rpc GenerateStream" in grpcurl(stack.grpc_target, "describe", "mstar.v1.InferenceService")
    out = grpcurl("-d", json.dumps(REQUEST), stack.grpc_target, "mstar.v1.InferenceService/GenerateStream")
    decoder, events, pos = json.JSONDecoder(), [], 0
    while pos < len(out.strip()):
        event, pos = decoder.raw_decode(out, pos)
        events.append(event)
        while pos < len(out) and out[pos].isspace():
            pos += 1
    assert "accepted" in events[0] and "complete" in events[-1]
    assert "".join(e["chunk"].get("text", "") for e in events if "chunk" in e)


def _node_modules() -> Path:
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node/npm not installed")
    modules = NODE_CACHE / "node_modules"
    if not (modules / "@grpc" / "grpc-js").is_dir() or not (modules / "@grpc" / "proto-loader").is_dir():
        NODE_CACHE.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NODE_CACHE),
                                 *NODE_PACKAGES], capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            pytest.skip(f"npm install of {NODE_PACKAGES} failed (offline?): {result.stderr[-500:]}")
    return modules


def test_node_grpc_js_client_streams_through_envoy(stack):
    modules = _node_modules()
    script = ROOT / "tests" / "e2e" / "node" / "stream_generate.js"
    result = subprocess.run(
        ["node", str(script), stack.grpc_target, str(ROOT / "protos"), str(ROOT / "build" / "googleapis"),
         str(ROOT / "third_party" / "protovalidate")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "NODE_PATH": str(modules)})
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["events"][0] == "accepted" and summary["events"][-1] == "complete"
    assert summary["text"]
