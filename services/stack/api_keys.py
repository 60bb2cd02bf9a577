"""The API keys `make run` turns on at Envoy: MSTAR_API_KEYS (comma-separated) and a keys file
(`--api-keys-file`, else MSTAR_API_KEYS_FILE: one key per line; blank lines and lines starting
with `#` are ignored). Both may be given; every key is accepted.

A key is what a client sends as `Authorization: Bearer KEY` or `x-api-key: KEY`, so it is printable
ASCII without spaces (and without commas in MSTAR_API_KEYS, which they separate). A source that
is named but holds no key is an error, never "auth off": a typo'd file must not open the server.
The keys reach only Envoy's rendered config (mode 0600); the children's environment never has
them (services/stack/process.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ENV_KEYS = "MSTAR_API_KEYS"
ENV_FILE = "MSTAR_API_KEYS_FILE"


class BadApiKeys(ValueError):
    pass


def configured(environ: Mapping[str, str] = os.environ, keys_file: Path | None = None) -> tuple[str, ...]:
    """Every key from MSTAR_API_KEYS and the keys file (`keys_file`, else MSTAR_API_KEYS_FILE),
    in order, each once; () when neither is set."""
    keys: list[str] = []
    if environ.get(ENV_KEYS, "").strip():
        keys += from_list(environ[ENV_KEYS])
    path = keys_file or (Path(environ[ENV_FILE]) if environ.get(ENV_FILE) else None)
    if path is not None:
        keys += from_file(path)
    return tuple(dict.fromkeys(keys))


def from_list(text: str) -> list[str]:
    keys = [part.strip() for part in text.split(",") if part.strip()]
    for i, key in enumerate(keys):
        _check(key, f"{ENV_KEYS} entry {i + 1}")
    if not keys:
        raise BadApiKeys(f"{ENV_KEYS} is set but holds no key")
    return keys


def from_file(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadApiKeys(f"cannot read the API keys file {path}: {exc}") from None
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        key = line.strip()
        if key and not key.startswith("#"):
            keys.append(_check(key, f"{path}, line {number}"))
    if not keys:
        raise BadApiKeys(f"the API keys file {path} holds no key")
    return keys


def _check(key: str, where: str) -> str:
    if not all("!" <= c <= "~" for c in key):
        raise BadApiKeys(f"{where}: an API key is printable ASCII without spaces")
    return key
