"""Generated sections of a markdown doc, between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def read(path: Path, name: str) -> str | None:
    """The section's body (without the markers and their newlines), or None if it is absent."""
    start, end = _markers(name)
    text = path.read_text() if path.exists() else ""
    match = re.search(re.escape(start) + r"\n(.*?)\n?" + re.escape(end), text, re.S)
    return match.group(1) if match else None


def write(path: Path, name: str, body: str) -> None:
    """Replace the section's body, or append the section at the end of the doc."""
    start, end = _markers(name)
    text = path.read_text() if path.exists() else ""
    block = f"{start}\n{body}\n{end}"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip("\n") + f"\n\n{block}\n"
    path.write_text(text)


def carried(path: Path, text: str) -> str:
    """`text` (a doc about to replace the one at `path`) with every generated section the old doc
    held and `text` lacks appended: a section another benchmark writes (e.g. `fairness`) survives
    a rerun of the doc's main benchmark."""
    old = path.read_text() if path.exists() else ""
    for name in re.findall(r"<!-- ([\w-]+):start -->", old):
        if f"<!-- {name}:start -->" not in text and (body := read(path, name)) is not None:
            start, end = _markers(name)
            text = text.rstrip("\n") + f"\n\n{start}\n{body}\n{end}\n"
    return text


def save(result: dict, json_path: str | None, doc: str | None, name: str, render: Callable[[dict], str]) -> None:
    """A benchmark's result as JSON at `json_path` and rendered into section `name` of `doc`
    (each only when given): the ending every `--json/--doc` benchmark shares."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=1))
    if doc:
        write(Path(doc), name, render(result))
