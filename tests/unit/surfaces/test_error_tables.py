"""Envoy's Lua filter (errors before the first byte) and the surfaces (errors after it) give an
HTTP status the same error `type` in the same body: deploy/envoy/api_errors.py renders the Lua's
tables and body from the surfaces' errors modules, and api_errors.lua itself names no type. (The
committed compose/k8s configs that embed the Lua are compared with a fresh render by
tests/unit/deploy/test_envoy_configs.py.)"""

from __future__ import annotations

import json
import re

import pytest

from deploy.envoy import api_errors
from deploy.envoy.api_errors import LUA, SHAPES, lua_source

ALL_TYPES = {t for shape in SHAPES.values() for t in (*shape.ERROR_TYPES.values(), shape.SERVER_ERROR_TYPE,
                                                      shape.CLIENT_ERROR_TYPE)}


def error_type_literals(lua: str) -> set[str]:
    """Every string literal in `lua` that reads as an error type: the ones it can emit."""
    literals = set(re.findall(r'"([^"\\]*)"', lua)) | set(re.findall(r"'([^'\\]*)'", lua))
    return {s for s in literals if s in ALL_TYPES or re.fullmatch(r"[a-z_]+_(error|large)", s)}


def lua_table(lua: str) -> dict[int, str]:
    block = re.search(r"local ERROR_TYPES = \{(.*?)\n\}", lua, re.S).group(1)
    return {int(k): v for k, v in re.findall(r'\[(\d+)\] = "([a-z_]+)"', block)}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_error_type_the_lua_can_emit_is_in_the_python_table_it_was_rendered_from(name):
    shape, lua = SHAPES[name], lua_source(name)
    python = {*shape.ERROR_TYPES.values(), shape.SERVER_ERROR_TYPE, shape.CLIENT_ERROR_TYPE}
    assert error_type_literals(lua) <= python
    assert lua_table(lua) == shape.ERROR_TYPES
    assert f'local SERVER_ERROR_TYPE = "{shape.SERVER_ERROR_TYPE}"' in lua
    assert f'local CLIENT_ERROR_TYPE = "{shape.CLIENT_ERROR_TYPE}"' in lua


def test_the_hand_written_lua_names_no_error_type():
    source = LUA.read_text()
    assert not error_type_literals(source) and not re.search(r"\[\d{3}\] =", source)
    assert source.count(api_errors.MARKER) == 1


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_lua_body_is_the_python_error_body(name):
    """The rendered concatenation, evaluated on sample values, is Python's error_body as compact JSON."""
    shape = SHAPES[name]
    body = re.search(r"return (.*)\nend", api_errors.lua_error_body(shape)).group(1)
    values = {"message": "m", "type_": "t", "code": "c", "param": ""}
    text = "".join(
        re.sub(r"quoted(_or_null)?\((\w+)\)",
               lambda m: "null" if m[1] and not values[m[2]] else f'"{values[m[2]]}"', piece).strip("'")
        for piece in body.split(" .. "))
    assert json.loads(text) == shape.error_body("m", "t", "c", None)


def test_bodies_in_either_shape_pass_unchanged():
    assert [api_errors.shaped_prefix(s) for s in SHAPES.values()] == ['{"error":', '{"type":"error","error":']
