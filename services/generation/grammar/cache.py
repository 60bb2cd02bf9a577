"""A least-recently-used map bounded by entry count and by total size (thread-safe)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class LruCache:
    def __init__(self, max_entries: int, max_bytes: int):
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"cache bounds must be >= 1, got {max_entries} entries, {max_bytes} bytes")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self.num_hits = 0
        self.num_misses = 0
        self.num_evictions = 0
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.num_misses += 1
                return None
            self._entries.move_to_end(key)
            self.num_hits += 1
            return entry[0]

    def put(self, key: Hashable, value: Any, num_bytes: int) -> None:
        """Insert (or refresh) key; evict the least recently used until both bounds hold. An entry
        larger than max_bytes on its own is not kept."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.num_bytes -= old[1]
            if num_bytes > self.max_bytes:
                return
            self._entries[key] = (value, num_bytes)
            self.num_bytes += num_bytes
            while len(self._entries) > self.max_entries or self.num_bytes > self.max_bytes:
                _, (_, size) = self._entries.popitem(last=False)
                self.num_bytes -= size
                self.num_evictions += 1
