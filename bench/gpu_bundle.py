"""What an offline GPU machine needs beyond its own torch/triton/transformers, fetched here into .gpu/.

    python -m bench.gpu_bundle [--python-version 3.12]          (make gpu-bundle)

.gpu/wheels/   manylinux x86-64 wheels, for the GPU machine's CPython (3.12 on the lent H200s,
               /work/.library/device/KINDS.md), of the packages the GPU run imports that its image
               lacks, at the versions requirements.lock pins; ``pip download --no-deps``, so the
               list is complete by construction of the import chain, checked by the dry run below
.gpu/model-a/, .gpu/model-b/
               the default model's GGUF (98 MB) in two halves with its sha256: one device call
               carries at most 64 MiB with the working tree, so the model travels in two calls
               (docs/kernels.md, "Running the GPU check"); bench/gpu_check.sh joins and checks it

``--check`` (no network) is the dry run: it imports what the GPU run imports and fails if that
needs a distribution beyond the device image and WHEELS, then validates the bundle on disk (a wheel
per pin, the model parts joining to the checksum, the first call's size).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / ".gpu"
# The GPU run's imports beyond torch, triton, numpy, transformers and pytest (all in the device
# image): the GGUF reader, and gRPC + google.rpc, which services.common.errors (imported by the
# engine) needs. protobuf and grpcio are in the image too, but at other versions than ours.
WHEELS = ("gguf", "grpcio", "grpcio-status", "googleapis-common-protos", "protobuf")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# Imported by grpc only if installed (grpc/__init__.py), and in the device image (KINDS.md).
OPTIONAL = {"grpcio-tools", "grpcio-health-checking", "grpcio-reflection"}
IN_IMAGE = {"torch", "triton", "numpy", "transformers", "pytest", "pyyaml", "tqdm", "safetensors", "tokenizers"}
GPU_RUN_IMPORTS = ("bench.engine", "bench.parity", "bench.kernels", "kernels.dispatch", "kernels.paged_attention",
                   "kernels.sampling", "services.generation.weights.gguf", "gguf", "services.generation.engine")
SPLIT_AT = 47 * 2**20  # model-a's size: 64 MiB minus the tree (~2 MiB) and the wheels (~10 MiB), with room
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def pinned(names=WHEELS, lock: Path = ROOT / "requirements.lock") -> list[str]:
    text = lock.read_text()
    out = []
    for name in names:
        match = re.search(rf"^{re.escape(name)}==([^\s\\]+)", text, re.M | re.I)
        if not match:
            raise SystemExit(f"gpu_bundle: {name} is not pinned in {lock}")
        out.append(f"{name}=={match.group(1)}")
    return out


def download_wheels(python_version: str) -> None:
    target = BUNDLE / "wheels"
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.whl"):
        old.unlink()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", *platforms,
           "-d", str(target), *pinned()]
    subprocess.run(cmd, check=True)


def split_model() -> str:
    from services.generation.weights.locate import default_model_path

    data = Path(default_model_path()).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    for part, chunk in (("model-a", data[:SPLIT_AT]), ("model-b", data[SPLIT_AT:])):
        folder = BUNDLE / part
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "part").write_bytes(chunk)
        (folder / "SHA256").write_text(f"{digest}  {MODEL_FILE}\n")
    return digest


def distributions_beyond_image() -> set[str]:
    """Distributions the GPU run's imports load beyond what torch, triton, transformers and pytest load."""
    for name in ("torch", "triton", "triton.testing", "numpy", "transformers", "pytest"):
        importlib.import_module(name)
    before = set(sys.modules)
    for name in GPU_RUN_IMPORTS:
        importlib.import_module(name)
    owners = importlib.metadata.packages_distributions()
    found: set[str] = set()
    for name in set(sys.modules) - before:
        path = getattr(sys.modules[name], "__file__", None) or ""
        if "site-packages/" in path:
            top = path.split("site-packages/", 1)[1].split("/")[0].removesuffix(".py")
            found.update(d.lower() for d in owners.get(top, [top]))
    return found - OPTIONAL - IN_IMAGE


def check() -> list[str]:
    """Problems with the bundle as it is on disk (empty: ready to travel)."""
    problems = []
    uncovered = distributions_beyond_image() - set(WHEELS)
    if uncovered:
        problems.append(f"the GPU run imports {', '.join(sorted(uncovered))}, in neither the device image nor WHEELS")
    wheels = sorted(p.name for p in (BUNDLE / "wheels").glob("*.whl"))
    for requirement in pinned():
        name, version = requirement.split("==")
        stem = name.replace("-", "_").lower()
        if not any(w.lower().startswith(f"{stem}-{version}-") for w in wheels):
            problems.append(f"no wheel for {requirement} in .gpu/wheels (have: {', '.join(wheels) or 'none'})")
    parts = [BUNDLE / p / "part" for p in ("model-a", "model-b")]
    if all(p.exists() for p in parts):
        digest = (BUNDLE / "model-a" / "SHA256").read_text().split()[0]
        joined = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()
        if joined != digest:
            problems.append(f"the model parts join to sha256 {joined[:12]}, not {digest[:12]}")
    else:
        problems.append("the model parts are missing: run make gpu-bundle")
    size_a = sum(f.stat().st_size for f in (BUNDLE / "wheels").glob("*")) + sum(
        f.stat().st_size for f in (BUNDLE / "model-a").glob("*"))
    if size_a > 60 * 2**20:
        problems.append(f".gpu/wheels + .gpu/model-a are {size_a / 2**20:.1f} MiB: with the tree, over 64 MiB")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_bundle", description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's CPython (3.12 on the lent H200s)")
    parser.add_argument("--check", action="store_true", help="only validate an existing .gpu/")
    args = parser.parse_args(argv)
    if not args.check:
        download_wheels(args.python_version)
        digest = split_model()
        print(f"gpu_bundle: {', '.join(pinned())} -> .gpu/wheels; {MODEL_FILE} (sha256 {digest[:12]}) -> "
              ".gpu/model-a + .gpu/model-b")
    problems = check()
    for p in problems:
        print(f"gpu_bundle: {p}", file=sys.stderr)
    if not problems:
        sizes = {d: sum(f.stat().st_size for f in (BUNDLE / d).glob("*")) / 2**20 for d in ("wheels", "model-a", "model-b")}
        print("gpu_bundle: ready: " + ", ".join(f".gpu/{d} {mib:.1f} MiB" for d, mib in sizes.items()))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
