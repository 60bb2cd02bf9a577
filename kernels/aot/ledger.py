"""ledger.json: each compiled configuration's resources, filed under Triton's compile hash.

The hash covers everything that can change the cubin (kernel source and callees, signature,
constexprs, options, target, Triton and ptxas versions, Triton's environment), so a stored entry
whose hash the matrix still produces is the compile's result, not a guess: the gate reuses it
instead of recompiling, and compiles whatever is new. ``python -m kernels.aot --update-ledger``
(``make kernels-doc``) rewrites it; the gate fails while it is out of date. Each gate run also
recompiles the default model's configurations and requires the stored numbers to match.
"""

from __future__ import annotations

import json
from pathlib import Path

from kernels.aot.build import Resources

PATH = Path(__file__).with_name("ledger.json")


def load(path: Path = PATH) -> dict[str, Resources]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {key: Resources.from_json(entry["resources"]) for key, entry in data["compiled"].items()}


def save(entries: dict[str, tuple[str, str, Resources]], triton_version: str, path: Path = PATH) -> None:
    """entries: key -> (kernel, arch, resources)."""
    data = {
        "generated_by": "python -m kernels.aot --update-ledger (make kernels-doc); do not edit",
        "triton": triton_version,
        "compiled": {
            key: {"kernel": kernel, "arch": arch, "resources": resources.to_json()}
            for key, (kernel, arch, resources) in sorted(entries.items())
        },
    }
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
