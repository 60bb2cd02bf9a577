"""Each room on its floor, read from every module's imports (ast; lazy imports in functions count too).

kernels/ is the floor below the services: it imports nothing from services/ (the AOT gate reads the
model's calls as data, kernels/aot/kernel_calls.json). In services/generation, weights/ (the
loaders) build what models/ computes with, so weights/ imports models/ and models/ never weights/.
And no import cycle runs through kernels/, models/ or weights/.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS, WEIGHTS = "services.generation.models", "services.generation.weights"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` names in an import (``from a import b`` names a.b when b is a module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")}
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in
              ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value))
    return names


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def modules(*packages: str) -> dict[str, Path]:
    return {module_name(p): p for package in packages for p in ROOT.joinpath(*package.split(".")).rglob("*.py")}


def graph(*packages: str) -> dict[str, set[str]]:
    """module -> the modules of ``packages`` it imports, for every module under them."""
    found = modules(*packages)
    return {name: {m for m in imported(path) if m in found and m != name} for name, path in found.items()}


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_kernels_import_nothing_from_services():
    found = modules("kernels")
    assert len(found) >= 20  # the walk found the package
    offenders = sorted((m, n) for m, path in found.items() for n in imported(path) if _under(n, "services"))
    assert not offenders, f"kernels/ imports from services/ (its floor is below them): {offenders}"


def test_weights_import_models_never_the_reverse():
    edges = graph("services.generation")
    up = {(m, n) for m, ns in edges.items() if _under(m, MODELS) for n in ns if _under(n, WEIGHTS)}
    assert not up, f"models/ imports weights/ (the loaders import the model's types, not the reverse): {sorted(up)}"
    assert any(_under(n, MODELS) for m, ns in edges.items() if _under(m, WEIGHTS) for n in ns)


def test_no_import_cycle_through_kernels_models_or_weights():
    edges = graph("kernels", "services.generation")
    watched = [m for m in edges if any(_under(m, p) for p in ("kernels", MODELS, WEIGHTS))]
    for start in watched:
        cycle = _cycle_from(start, edges)
        assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def _cycle_from(start: str, edges: dict[str, set[str]]) -> list[str] | None:
    """A path start -> ... -> start through the import graph, or None (depth-first)."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_the_surfaces_vocabulary_stays_in_preprocess():
    """How OpenAI or Anthropic spell a field (surfaces/sampling_names.py) is preprocess's business:
    common/ and the generation service import nothing from services.preprocess."""
    found = modules("services.common", "services.generation")
    assert len(found) >= 60
    offenders = sorted((m, n) for m, path in found.items() for n in imported(path) if _under(n, "services.preprocess"))
    assert not offenders, f"common/ or generation/ import preprocess: {offenders}"
    spelled = [m for m, path in found.items() if "max_completion_tokens" in path.read_text()]
    assert not spelled, f"a surface's field name outside preprocess: {spelled}"


def test_no_module_of_services_imports_one_that_imports_it_back():
    """No import cycle anywhere in services/ (preprocess's stream and its requests used to call each
    other: a request now knows its stream as backend_request.RequestStream). `from pkg import mod`
    also names pkg's __init__; a submodule's edge to its own package is that, not a cycle."""
    edges = {m: {n for n in ns if not _under(m, n)} for m, ns in graph("services").items()}
    assert len(edges) >= 140
    for start in edges:
        cycle = _cycle_from(start, edges)
        assert cycle is None, f"import cycle: {' -> '.join(cycle)}"
    backend_request = ROOT / "services" / "preprocess" / "backend_request.py"
    assert "services.preprocess.backend" not in imported(backend_request)
