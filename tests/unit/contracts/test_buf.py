"""buf lint (STANDARD) and buf format are clean, and a broken .proto fails `make proto` loudly."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
BUF = pathlib.Path(sys.executable).parent / "buf"


def _run(*args, cwd=ROOT):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_buf_lint_clean():
    result = _run(str(BUF), "lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_format_clean():
    result = _run(str(BUF), "format", "--diff", "--exit-code", "protos")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_proto_fails_loudly_on_a_broken_proto(tmp_path):
    # Work on a copy so the real gen/ is untouched.
    for name in ["Makefile", "buf.yaml", "requirements.txt", "requirements-dev.txt"]:
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    shutil.copytree(ROOT / "third_party", tmp_path / "third_party")
    (tmp_path / "build").mkdir()
    shutil.copytree(ROOT / "build" / "googleapis", tmp_path / "build" / "googleapis")
    broken = tmp_path / "protos" / "mstar" / "v1" / "messages.proto"
    broken.write_text(broken.read_text().replace("message Usage {", "message Usage { int32 oops = ;", 1))
    venv = pathlib.Path(sys.executable).parents[1]
    (tmp_path / ".venv").symlink_to(venv)
    # Mark setup and googleapis as up to date so only protoc runs.
    for stamp in [tmp_path / ".venv" / ".setup-stamp", tmp_path / "build" / "googleapis" / ".stamp"]:
        assert stamp.exists()
    result = _run("make", "-o", ".venv/.setup-stamp", "-o", "build/googleapis/.stamp", "proto", cwd=tmp_path)
    assert result.returncode != 0
    assert "messages.proto" in result.stderr and "Expected" in result.stderr, result.stderr


def test_breaking_check_judges_each_package_and_honours_only_listed_breaks(monkeypatch, capsys, tmp_path):
    sys.path.insert(0, str(ROOT / "protos"))
    import check_breaking

    allowances = tmp_path / "breaking_allowed.txt"
    allowances.write_text("# why\nMESSAGE_NO_DELETE mstar/v1/messages.proto Envelope  # a listed break\n")
    monkeypatch.setattr(check_breaking, "ALLOWED", allowances)

    listed = {"type": "MESSAGE_NO_DELETE", "path": "protos/mstar/v1/messages.proto",
              "message": 'Previously present message "Envelope" was deleted from file.'}
    unlisted = {"type": "FIELD_NO_DELETE", "path": "protos/mstar/generation/v1/generation_service.proto",
                "message": 'Previously present field "1" with name "frames" on message "StreamRequest" was deleted.'}
    monkeypatch.setattr(check_breaking, "violations", lambda against: [listed])
    assert check_breaking.main("base") == 0
    monkeypatch.setattr(check_breaking, "violations", lambda against: [listed, unlisted])
    assert check_breaking.main("base") == 1
    out = capsys.readouterr().out
    assert "mstar.v1 (public): OK (1 allowed" in out and "mstar.generation.v1 (internal): BREAKING" in out
