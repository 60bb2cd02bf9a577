"""The engine core imports neither torch nor grpc (docs/design.md, Rules).

The loop, its parts, the scheduler's and block manager's books, the outputs and the domain errors
are plain Python: the model runner (torch) is injected into the engine and protobuf stops at the
servicers (services/common/grpc_errors.py maps errors to the wire). Each module is imported in a
fresh interpreter, so a stray import anywhere in its closure fails here, not only one this test
process happened to load first.
"""

import json
import subprocess
import sys

import pytest

CORE = [
    "services.generation.engine",
    "services.generation.engine_commands",
    "services.generation.engine_step",
    "services.generation.request_endings",
    "services.generation.postprocess",
    "services.generation.scheduler",
    "services.generation.block_manager",
    "services.generation.sequence",
    "services.generation.image_inputs",
    "services.generation.draft",
    "services.generation.outputs",
    "services.generation.request_checks",
    "services.generation.stats",
    "services.generation.heap",
    "services.generation.watchdog",
    "services.common.fault_boundary",
    "services.common.errors",
]

# A module is impure if it or anything it pulls in loads one of these.
FORBIDDEN_ROOTS = ("torch", "grpc", "grpc_status", "google.protobuf", "google.rpc", "mstar")

_PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
roots = tuple(sys.argv[2].split(","))
bad = sorted(m for m in sys.modules if m in roots or m.startswith(tuple(r + "." for r in roots))
             or m.endswith("_pb2") or m.endswith("_pb2_grpc"))
print(json.dumps(bad))
"""


def _forbidden_after_import(module: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, module, ",".join(FORBIDDEN_ROOTS)],
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_neither_torch_nor_grpc(module):
    bad = _forbidden_after_import(module)
    shallowest = sorted(bad, key=lambda m: (m.count("."), m))[:8]
    assert not bad, f"{module} pulls in {shallowest} ({len(bad)} modules)"


def test_the_probe_sees_a_stray_import():
    # The check itself can fail: the servicer-side error mapping is impure by design.
    assert "grpc" in _forbidden_after_import("services.common.grpc_errors")
