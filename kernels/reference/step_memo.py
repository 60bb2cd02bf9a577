"""A one-entry cache for index tensors that every layer of a step would otherwise rebuild.

The model calls each reference op once per layer with the SAME step-metadata tensors (positions,
slot mapping, block tables, ...). Deriving gather indices, masks and rotary rows from them costs
about as much as the attention itself at decode sizes (measured ~0.16 ms of Python and small ops
per layer, x 30 layers, at 16 sequences), so each op derives them once per step here.

The key is the identity of the input tensors, and the entry holds references to them, so a key
object cannot be freed and its id reused while the entry lives. Callers must not mutate a key
tensor in place between calls (the model never does: step metadata is built once per step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

_entries: dict[str, tuple[tuple[torch.Tensor, ...], object]] = {}


def per_step(name: str, keys: tuple[torch.Tensor, ...], build: Callable[[], T]) -> T:
    """build() once for this name and these exact key tensors; later calls with them reuse it."""
    entry = _entries.get(name)
    if entry is not None and len(entry[0]) == len(keys) and all(a is b for a, b in zip(entry[0], keys, strict=True)):
        return entry[1]  # type: ignore[return-value]
    value = build()
    _entries[name] = (keys, value)
    return value
