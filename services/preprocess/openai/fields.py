"""Typed readers for OpenAI JSON request fields.

Each reader takes the decoded body (a dict), a key and the dotted path used in error messages, and
returns the value or raises a 400 (`errors.invalid_argument`) that names the field. JSON types are
checked strictly: `true` is not an integer, `"256"` is not a number, `1.5` is not an integer. A
missing key or an explicit `null` means "not given" (None), as in the OpenAI API.
"""

from __future__ import annotations

import math
from typing import Any

from services.common import errors

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _path(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def get_int(obj: dict, key: str, *, lo: int, hi: int, prefix: str = "") -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    name = _path(prefix, key)
    # bool is an int subclass in Python; JSON `true` must not pass as 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.invalid_argument(name, f"must be an integer, got {type_name(value)}")
    if not lo <= value <= hi:
        raise errors.invalid_argument(name, f"must be in [{lo}, {hi}], got {value}")
    return value


def get_float(
    obj: dict, key: str, *, lo: float, hi: float, lo_open: bool = False, prefix: str = ""
) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    name = _path(prefix, key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise errors.invalid_argument(name, f"must be a number, got {type_name(value)}")
    value = float(value)
    low_ok = value > lo if lo_open else value >= lo
    if not math.isfinite(value) or not low_ok or value > hi:
        bracket = "(" if lo_open else "["
        raise errors.invalid_argument(name, f"must be in {bracket}{lo}, {hi}], got {value}")
    return value


def get_bool(obj: dict, key: str, *, prefix: str = "") -> bool | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise errors.invalid_argument(_path(prefix, key), f"must be a boolean, got {type_name(value)}")
    return value


def get_str(obj: dict, key: str, *, max_len: int, prefix: str = "") -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    name = _path(prefix, key)
    if not isinstance(value, str):
        raise errors.invalid_argument(name, f"must be a string, got {type_name(value)}")
    if len(value) > max_len:
        raise errors.invalid_argument(name, f"longer than {max_len} characters")
    return value


def get_object(obj: dict, key: str, *, prefix: str = "") -> dict | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise errors.invalid_argument(_path(prefix, key), f"must be an object, got {type_name(value)}")
    return value


def get_stop(obj: dict, key: str, *, max_count: int, max_len: int) -> list[str]:
    """`stop`: a string or a list of strings (OpenAI accepts both); empty strings are dropped."""
    value = obj.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise errors.invalid_argument(key, f"must be a string or a list of strings, got {type_name(value)}")
    if len(value) > max_count:
        raise errors.invalid_argument(key, f"at most {max_count} stop strings, got {len(value)}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise errors.invalid_argument(f"{key}[{i}]", f"must be a string, got {type_name(item)}")
        if len(item) > max_len:
            raise errors.invalid_argument(f"{key}[{i}]", f"longer than {max_len} characters")
        if item:
            out.append(item)
    return out


def get_int_list(obj: dict, key: str, *, max_count: int, lo: int, hi: int) -> list[int]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise errors.invalid_argument(key, f"must be a list of integers, got {type_name(value)}")
    if len(value) > max_count:
        raise errors.invalid_argument(key, f"at most {max_count} entries, got {len(value)}")
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or not lo <= item <= hi:
            raise errors.invalid_argument(f"{key}[{i}]", f"must be an integer in [{lo}, {hi}]")
    return list(value)


def type_name(value: Any) -> str:
    """JSON type names in messages, so clients see their own vocabulary, not Python's."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"
