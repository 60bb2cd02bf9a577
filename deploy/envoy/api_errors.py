"""api_errors.lua, rendered once per API error shape from the surface that owns the shape.

The surfaces' errors modules (services/preprocess/surfaces/{openai,anthropic}/errors.py) are the
one authority for an error shape: its status -> `type` table, the fallback type of each status
class, and `error_body`, the object itself. The surfaces render errors after a stream's first
byte with them; Envoy's Lua filter reshapes errors that end a call before it. Its tables and its
body are written here from the same module, so the Lua holds no copy to keep in step by hand:
`error_body` is called with placeholder arguments and its JSON becomes a Lua concatenation.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from types import ModuleType

from services.preprocess.surfaces.anthropic import errors as anthropic
from services.preprocess.surfaces.openai import errors as openai

LUA = Path(__file__).resolve().parent / "api_errors.lua"
MARKER = "--[[ RENDERED: ERROR_TYPES, SERVER_ERROR_TYPE, CLIENT_ERROR_TYPE, SHAPED_PREFIXES, error_body ]]"
SHAPES: dict[str, ModuleType] = {"openai": openai, "anthropic": anthropic}
_SLOT = re.compile(r'"@(\w+)@"')


def _lua_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _body_template(shape: ModuleType) -> tuple[list[str], str]:
    """error_body's parameters and its compact JSON with each argument a `"@name@"` slot."""
    names = list(inspect.signature(shape.error_body).parameters)
    return names, json.dumps(shape.error_body(*(f"@{n}@" for n in names)), separators=(",", ":"))


def shaped_prefix(shape: ModuleType) -> str:
    """How a body already in this shape starts (Envoy prints compact JSON): the text before the
    first argument, up to the object that holds it."""
    _, template = _body_template(shape)
    head = template[: _SLOT.search(template).start()]
    return head[: head.rindex("{")]


def lua_error_body(shape: ModuleType) -> str:
    """error_body as a Lua function over the raw (still escaped) JSON string contents: a parameter
    the Python side types `| None` becomes quoted_or_null (an absent or empty one is null)."""
    parameters = inspect.signature(shape.error_body).parameters
    names, template = _body_template(shape)
    pieces = []
    for i, part in enumerate(_SLOT.split(template)):
        if i % 2 == 0:
            if part:
                pieces.append(_lua_string(part))
        else:
            nullable = "None" in str(parameters[part].annotation)
            pieces.append(f"{'quoted_or_null' if nullable else 'quoted'}({part})")
    return (f"local function error_body({', '.join(names)})\n"
            f"  return {' .. '.join(pieces)}\n"
            "end")


def rendered_part(name: str) -> str:
    shape = SHAPES[name]
    source = shape.__name__.replace(".", "/") + ".py"
    rows = "".join(f'  [{status}] = "{type_}",\n' for status, type_ in sorted(shape.ERROR_TYPES.items()))
    prefixes = ", ".join(_lua_string(shaped_prefix(s)) for s in SHAPES.values())
    return (f"-- Rendered by deploy/envoy/api_errors.py from {source}.\n"
            f"local ERROR_TYPES = {{\n{rows}}}\n"
            f'local SERVER_ERROR_TYPE = "{shape.SERVER_ERROR_TYPE}"\n'
            f'local CLIENT_ERROR_TYPE = "{shape.CLIENT_ERROR_TYPE}"\n'
            f"-- Bodies in any API's shape pass unchanged.\n"
            f"local SHAPED_PREFIXES = {{{prefixes}}}\n\n"
            f"{lua_error_body(shape)}")


def lua_source(name: str) -> str:
    """api_errors.lua for one API's error shape ("openai" or "anthropic")."""
    source = LUA.read_text(encoding="utf-8")
    if source.count(MARKER) != 1:
        raise ValueError(f"{LUA} must hold the marker line once: {MARKER}")
    return source.replace(MARKER, rendered_part(name))
