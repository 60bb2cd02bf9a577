"""services/common/env_flags.py: every flag is also MSTAR_<PREFIX><FLAG>, the command line wins, a
bad value is an error naming the variable; and the names `make run` documented before the rule
(MSTAR_MODEL, MSTAR_HTTP_PORT, ...) are exactly what the rule yields, so no deployment breaks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.common.env_flags import env_argv, parse_with_env, settings
from services.generation import __main__ as generation
from services.preprocess import __main__ as preprocess
from services.stack import __main__ as stack


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    p.add_argument("--kv-blocks", type=int, default=8)
    p.add_argument("--dtype", choices=["auto", "float32"], default="auto")
    p.add_argument("--root", type=Path)
    p.add_argument("--fast", action="store_true")
    p.add_argument("--index", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--tag", action="append")
    return p


def test_a_variable_sets_a_flag_and_the_command_line_wins():
    env = {"T_KV_BLOCKS": "32", "T_ROOT": "/srv/files", "T_FAST": "yes", "T_INDEX": "off", "T_DTYPE": ""}
    args = parse_with_env(parser(), "T_", [], env)
    assert (args.kv_blocks, args.root, args.fast, args.index, args.dtype) == (32, Path("/srv/files"), True, False, "auto")
    args = parse_with_env(parser(), "T_", ["--kv-blocks", "4", "--index"], env)
    assert (args.kv_blocks, args.index) == (4, True)
    assert parse_with_env(parser(), "T_", [], {"T_FAST": "0"}).fast is False
    assert env_argv(parser(), "T_", {"T_TAG": "a b"}) == []  # repeated flags: no one reading of a string


@pytest.mark.parametrize(("env", "says"), [
    ({"T_KV_BLOCKS": "many"}, "T_KV_BLOCKS='many' is not a valid --kv-blocks value"),
    ({"T_DTYPE": "fp8"}, "T_DTYPE='fp8': --dtype is one of auto, float32"),
    ({"T_FAST": "maybe"}, "T_FAST='maybe': use one of"),
])
def test_a_bad_value_is_an_error_naming_the_variable(env, says, capsys):
    with pytest.raises(SystemExit) as info:
        parse_with_env(parser(), "T_", [], env)
    assert info.value.code == 2 and says in capsys.readouterr().err


PARSERS = {"stack": (stack.build_parser, stack.ENV_PREFIX), "generation": (generation.build_parser, generation.ENV_PREFIX),
           "preprocess": (preprocess.build_parser, preprocess.ENV_PREFIX)}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_flag_of_every_program_has_its_own_variable(name):
    build, prefix = PARSERS[name]
    p = build()
    flags = {s for a in p._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    rows = settings(p, prefix)
    names = [var for var, _, _ in rows]
    assert len(names) == len(set(names))
    assert {flag for _, flag, _ in rows} == {f for f in flags if not f.startswith("--no-")}
    assert all(var.startswith(prefix) for var in names)


def test_make_runs_documented_variables_keep_their_names():
    names = {var for var, _, _ in settings(stack.build_parser(), stack.ENV_PREFIX)}
    assert {"MSTAR_MODEL", "MSTAR_HTTP_PORT", "MSTAR_ADMIN_PORT", "MSTAR_PREPROCESS_PORT", "MSTAR_GENERATION_PORT",
            "MSTAR_GENERATION_METRICS_PORT", "MSTAR_PREPROCESS_METRICS_PORT", "MSTAR_DTYPE", "MSTAR_QUANTIZATION",
            "MSTAR_DATA_DIR", "MSTAR_DEFAULT_MAX_TOKENS", "MSTAR_OTLP_ENDPOINT", "MSTAR_GENERATION_REPLICAS",
            "MSTAR_PREPROCESS_REPLICAS", "MSTAR_API_KEYS_FILE", "MSTAR_FILE_ROOT"} <= names


def test_make_run_settings_reach_the_children(monkeypatch, tmp_path):
    from services.stack.stack import Stack

    monkeypatch.setenv("MSTAR_FILE_ROOT", str(tmp_path))
    monkeypatch.setenv("MSTAR_HTTP_PORT", "18080")
    monkeypatch.setenv("MSTAR_GENERATION_REPLICAS", "2")
    config = stack.stack_config(stack.parse_args(["--http-port", "18081"]), ())
    assert (config.http_port, config.generation_replicas, config.file_root) == (18081, 2, tmp_path)
    argv = Stack(config).preprocess_argv(0)
    assert argv[argv.index("--file-root") + 1] == str(tmp_path)
    monkeypatch.delenv("MSTAR_FILE_ROOT")
    assert "--file-root" not in Stack(stack.stack_config(stack.parse_args([]), ())).preprocess_argv(0)  # no files


def test_a_service_reads_its_own_flags_from_the_environment(monkeypatch):
    monkeypatch.setenv("MSTAR_GENERATION_MAX_NUM_SEQS", "8")
    monkeypatch.setenv("MSTAR_PREPROCESS_MAX_REQUESTS", "5")
    assert generation.parse_args([]).max_num_seqs == 8
    assert generation.parse_args(["--max-num-seqs", "2"]).max_num_seqs == 2
    assert preprocess.parse_args([]).max_requests == 5
