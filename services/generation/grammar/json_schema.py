"""JSON Schemas adjusted before xgrammar compiles them, where xgrammar 0.2.9 would admit invalid JSON.

xgrammar writes a string with minLength/maxLength as ``[^"\\\\\\r\\n]{min,max}``: a raw TAB or any other
control character passes, and the document is no longer JSON (json.loads rejects it; found by
tests/unit/generation/test_structured_output_properties.py). Such a string becomes a ``pattern``
with the same bounds over the characters that need no escape, which xgrammar's pattern path checks
as JSON text. Nothing valid is lost: xgrammar's bounded strings could not hold escapes before either.
"""

from __future__ import annotations

import json

_DATA_KEYS = frozenset({"enum", "const", "default", "examples"})  # values there are data, not schemas
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_PLAIN_CHARACTER = '[^\\x00-\\x1f"\\\\]'  # regex: one character JSON writes as itself


def safe_schema_text(text: str) -> str:
    """The schema text to compile: bounded strings rewritten, everything else as given."""
    schema = json.loads(text)
    fixed = _fix(schema)
    return text if fixed == schema else json.dumps(fixed, ensure_ascii=False)


def _fix(node):
    """node is a schema, or a list/keyword value that may hold schemas."""
    if isinstance(node, list):
        return [_fix(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _DATA_KEYS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):  # name -> schema: the names are not keywords
            out[key] = {name: _fix(schema) for name, schema in value.items()}
        else:
            out[key] = _fix(value)
    low, high = out.get("minLength", 0), out.get("maxLength")
    bounded = ("minLength" in out or "maxLength" in out) and _is_count(low) and (high is None or _is_count(high))
    if bounded and (high is None or low <= high):  # impossible bounds stay for xgrammar to name
        if out.get("type") == "string" and not {"pattern", "format", "enum", "const"} & out.keys():
            out.pop("minLength", None), out.pop("maxLength", None)
            out["pattern"] = f"^{_PLAIN_CHARACTER}{{{low},{'' if high is None else high}}}$"
    return out


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
