"""Each surface is a thin adapter on the domain: it never imports another surface, the servicer,
grpc or generated protobuf types (found by reading every module's imports)."""

from __future__ import annotations

import ast
from pathlib import Path

SURFACES = Path(__file__).resolve().parents[3] / "services" / "preprocess" / "surfaces"
FORBIDDEN = ("grpc", "mstar.v1", "google.api", "google.protobuf", "services.preprocess.servicer",
             "services.preprocess.http_routes", "services.preprocess.wire", "services.preprocess.backend")


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_surfaces_import_no_other_surface_no_servicer_no_protobuf():
    packages = [p for p in SURFACES.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    assert {p.name for p in packages} >= {"openai", "anthropic", "responses", "vllm"}
    checked = 0
    for package in packages:
        others = {f"services.preprocess.surfaces.{p.name}" for p in packages if p != package}
        for module in package.glob("*.py"):
            for name in imports(module):
                assert not any(name == o or name.startswith(o + ".") for o in others), (module, name)
                assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), (module, name)
            checked += 1
    every = {f"services.preprocess.surfaces.{p.name}" for p in packages}
    for shared in SURFACES.glob("*.py"):  # what all surfaces share knows none of them
        for name in imports(shared):
            assert not any(name == o or name.startswith(o + ".") for o in every), (shared, name)
            assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), (shared, name)
    assert checked >= 12
