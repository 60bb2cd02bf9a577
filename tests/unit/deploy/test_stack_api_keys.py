"""`make run`'s API keys (services/stack/api_keys.py): MSTAR_API_KEYS and a keys file reach Envoy's
settings, a named source without a key refuses to start instead of serving unauthenticated, and
no child process inherits the keys."""

from __future__ import annotations

import sys
import time

import pytest

from services.stack import __main__ as launcher
from services.stack import api_keys
from services.stack.process import Child
from services.stack.stack import Stack, StackConfig


def test_keys_from_the_environment_and_a_file_are_all_accepted_once(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# production\nsk-one\n\n  sk-two  \n# sk-commented-out\nsk-one\n")
    assert api_keys.configured({}, keys) == ("sk-one", "sk-two")
    assert api_keys.configured({"MSTAR_API_KEYS": " sk-three, sk-one ,", "MSTAR_API_KEYS_FILE": str(keys)}) == (
        "sk-three", "sk-one", "sk-two")
    assert api_keys.configured({"MSTAR_API_KEYS": ""}) == ()  # set but empty: as unset
    assert api_keys.configured({}) == ()


@pytest.mark.parametrize(("environ", "text", "says"), [
    ({}, "# nothing but comments\n\n", "holds no key"),
    ({"MSTAR_API_KEYS": " , ,"}, None, "holds no key"),
    ({}, "sk good\n", "line 1"),
    ({"MSTAR_API_KEYS": "sk-ok,sk\tsecret"}, None, "entry 2"),
])
def test_a_named_source_without_a_usable_key_is_an_error_that_shows_no_key(tmp_path, environ, text, says):
    path = None
    if text is not None:
        path = tmp_path / "keys"
        path.write_text(text)
    with pytest.raises(api_keys.BadApiKeys) as info:
        api_keys.configured(environ, path)
    assert says in str(info.value) and "secret" not in str(info.value) and "good" not in str(info.value)


def test_a_missing_keys_file_stops_make_run_before_anything_starts(tmp_path, capsys):
    assert launcher.main(["--api-keys-file", str(tmp_path / "absent")]) == 2
    assert "cannot read the API keys file" in capsys.readouterr().err


def test_the_keys_reach_envoys_settings(monkeypatch):
    monkeypatch.setenv("MSTAR_API_KEYS", "sk-a,sk-b")
    config = launcher.stack_config(launcher.parse_args([]), api_keys.configured())
    assert config.api_keys == ("sk-a", "sk-b")
    assert Stack(config).envoy_settings().api_keys == ("sk-a", "sk-b")
    assert Stack(StackConfig(api_keys=("sk-c",))).envoy_settings().api_keys == ("sk-c",)
    assert Stack(StackConfig()).envoy_settings().api_keys == ()
    overridden = StackConfig(api_keys=("sk-c",), envoy_overrides={"api_keys": ("sk-d",)})
    assert Stack(overridden).envoy_settings().api_keys == ("sk-d",)  # a test's explicit override wins


def test_no_child_inherits_the_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("MSTAR_API_KEYS", "sk-never-inherited")
    monkeypatch.setenv("MSTAR_SOMETHING_ELSE", "kept")
    code = "import os; print(sorted(k for k in os.environ if k.startswith('MSTAR_')), flush=True)"
    child = Child("env", [sys.executable, "-c", code], tmp_path / "env.log")
    deadline = time.monotonic() + 20
    while child.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    child.stop(1)
    printed = child.log_path.read_text()
    assert "MSTAR_SOMETHING_ELSE" in printed and "MSTAR_API_KEYS" not in printed, printed
