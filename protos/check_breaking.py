"""`make breaking`: buf breaking (FILE rules) against a base revision, reported per package.

    python protos/check_breaking.py build/against      # the base tree `make breaking` prepared

Each package is judged on its own: mstar.v1 is the public API and must not break;
mstar.generation.v1 is the internal contract between the two services. A deliberate break is
listed, with its reason, in protos/breaking_allowed.txt (`RULE FILE [NAME]` per line, NAME the
quoted name in buf's message); anything else fails. Entries are matched exactly, so once the
base revision contains the change they simply stop matching and can be deleted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = Path(__file__).with_name("breaking_allowed.txt")
PACKAGES = {"mstar/v1/": "mstar.v1 (public)", "mstar/generation/v1/": "mstar.generation.v1 (internal)"}


def allowed() -> set[tuple[str, ...]]:
    entries = set()
    for line in ALLOWED.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            entries.add(tuple(line.split()))
    return entries


def violations(against: str) -> list[dict]:
    buf = Path(sys.executable).parent / "buf"
    result = subprocess.run([str(buf), "breaking", "--against", against, "--error-format", "json"],
                            cwd=ROOT, capture_output=True, text=True)
    if result.returncode not in (0, 100) and not result.stdout.strip():
        sys.exit(f"buf breaking failed: {result.stderr.strip()}")
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def key(v: dict) -> tuple[str, ...]:
    names = re.findall(r'"([^"]+)"', v["message"])
    file = v.get("path", "").removeprefix("protos/") or (names[0] if names else "?")
    name = [n for n in names if n != file][:1]
    return (v["type"], file, *name)


def main(against: str) -> int:
    accepted, failed = allowed(), False
    found: dict[str, list[tuple[tuple[str, ...], bool]]] = {label: [] for label in PACKAGES.values()}
    for v in violations(against):
        k = key(v)
        label = next((lbl for prefix, lbl in PACKAGES.items() if k[1].startswith(prefix)), "other")
        found.setdefault(label, []).append((k, k in accepted))
    for label, items in found.items():
        bad = [k for k, ok in items if not ok]
        failed = failed or bool(bad)
        print(f"{label}: {'OK' if not bad else 'BREAKING'} ({len(items) - len(bad)} allowed, {len(bad)} not)")
        for k in bad:
            print("  " + " ".join(k))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
