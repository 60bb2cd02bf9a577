"""Envoy's Lua filter (errors before the first byte) and the surfaces (errors after it) give an
HTTP status the same error `type`: deploy/envoy/api_errors.lua holds copies of both tables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy.envoy.render import LUA, lua_source
from services.preprocess.surfaces.anthropic import render as anthropic
from services.preprocess.surfaces.openai import render as openai


def lua_table(name: str) -> dict[int, str]:
    block = re.search(name + r" = \{(.*?)\n\}", Path(LUA).read_text(), re.S).group(1)
    return {int(k): v for k, v in re.findall(r'\[(\d+)\] = "([a-z_]+)"', block)}


@pytest.mark.parametrize(("table", "python"), [("OPENAI_TYPES", openai.ERROR_TYPES),
                                               ("ANTHROPIC_TYPES", anthropic.ERROR_TYPES)])
def test_lua_error_types_match_python(table, python):
    assert lua_table(table) == python


def test_one_lua_source_per_shape():
    assert 'local SHAPE = "anthropic"' in lua_source("anthropic") and 'local SHAPE = "openai"' in lua_source("openai")
