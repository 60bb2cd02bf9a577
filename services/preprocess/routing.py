"""Which generation replica a new request goes to: prefix affinity under a load bound.

The policy (docs/design.md, "Routing across generation replicas"):

1. **Candidates** are the replicas that can take work now: stream up, health SERVING (not
   starting, draining or failed). None → the caller answers UNAVAILABLE.
2. **Affinity key**: a hash chained over the prompt's first `affinity_blocks` *full* KV blocks
   (`block_size` tokens each) — the unit the engine's prefix cache shares. Equal prefixes give
   equal keys; a prompt shorter than one block has no key (nothing cacheable to share).
3. **Rendezvous ranking**: every candidate gets the weight hash(key, replica address); the ranking
   is the same in every preprocess replica and needs no shared state, and when a replica leaves
   only the keys it ranked first move (to their second choice).
4. **Load bound**: walk the ranking and take the first replica whose load is within `load_margin`
   of the least-loaded candidate's. A hot prefix therefore overflows to its *second* rendezvous
   choice (which then warms the same prefix), not to a random replica.
5. No key → the least-loaded candidate (ties broken by address, for determinism).

Load is in units of requests: what this preprocess has in flight there now (exact) + what everyone
else had there at the replica's last pushed ConductorStatus (`others_from_status`), plus
`kv_weight` × its KV-cache use (0..1), so a replica whose cache is nearly full looks busier than
its request count says.

Pure and torch/grpc-free: the real backend pool and bench/routing_sim.py both use it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

PREFIX = "prefix"  # the replica this router last sent the longest matching prefix to
AFFINITY = "affinity"  # the key's first rendezvous choice
OVERFLOW = "overflow"  # a later rendezvous choice: the first ones were over the load bound
LEAST_LOADED = "least_loaded"  # no affinity key (prompt shorter than one block)


@dataclass(frozen=True)
class RoutingConfig:
    block_size: int = 16  # tokens per KV block; must match the generation service's --block-size
    affinity_blocks: int = 4  # full blocks hashed into the affinity key (64 tokens by default)
    load_margin: float = 8.0  # requests a preferred replica may carry above the least-loaded one (bench/routing_sim.py)
    kv_weight: float = 8.0  # a full KV cache counts as this many extra requests

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.affinity_blocks < 1:
            raise ValueError("block_size and affinity_blocks must be >= 1")
        if self.load_margin < 0 or self.kv_weight < 0:
            raise ValueError("load_margin and kv_weight must be >= 0")


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router knows about one candidate replica."""

    address: str  # stable identity (host:port) — the rendezvous hash input
    in_flight: int = 0  # requests THIS preprocess routed there that have not ended (exact, immediate)
    others: int = 0  # everyone else's running + waiting there, as of its last ConductorStatus
    kv_usage: float = 0.0  # used / total KV blocks, 0..1, from the same status

    def load(self, kv_weight: float) -> float:
        return self.in_flight + self.others + kv_weight * min(max(self.kv_usage, 0.0), 1.0)


def others_from_status(running: int, waiting: int, in_flight_then: int) -> int:
    """Other clients' requests on a replica: its pushed running + waiting minus what this preprocess
    had in flight there when the status arrived. Counting our own requests from the live count
    instead of the (up to one interval old) status is what keeps one router from herding every
    new request onto the replica that looked idlest a second ago."""
    return max(0, running + waiting - in_flight_then)


@dataclass(frozen=True)
class Decision:
    address: str
    reason: str  # PREFIX | AFFINITY | OVERFLOW | LEAST_LOADED
    rank: int = 0  # position in the key's rendezvous ranking (0 = first choice)


def block_hashes(token_ids: Sequence[int], block_size: int, limit: int | None = None) -> list[bytes]:
    """Chained hashes of the prompt's full blocks (each covers every token before it), at most `limit`."""
    num_full = len(token_ids) // block_size
    if limit is not None:
        num_full = min(num_full, limit)
    out, parent = [], b""
    for i in range(num_full):
        # Token ids are vocabulary indices (< 2**31): int32 bytes are an exact, compact encoding.
        body = array("i", token_ids[i * block_size : (i + 1) * block_size]).tobytes()
        parent = hashlib.blake2b(parent + body, digest_size=16).digest()
        out.append(parent)
    return out


def affinity_key(token_ids: Sequence[int], config: RoutingConfig) -> bytes | None:
    """Hash of the first `affinity_blocks` full blocks, or None when there is no full block."""
    hashes = block_hashes(token_ids, config.block_size, config.affinity_blocks)
    return hashes[-1] if hashes else None


def rendezvous_weight(key: bytes, address: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + address.encode(), digest_size=8).digest(), "big")


def rank(key: bytes, addresses: Sequence[str]) -> list[str]:
    """The key's rendezvous order over these replicas (highest weight first)."""
    return sorted(addresses, key=lambda a: (rendezvous_weight(key, a), a), reverse=True)


class PrefixIndex:
    """Where this router last sent each full-block prefix (bounded LRU of block hash → address).

    Rendezvous on the first blocks keeps a tenant's system prompt on one replica; the index adds
    what the key cannot see: the later turns of a conversation share far more than the first
    blocks with the turn before, and that replica holds them all (until it evicts them: the index
    is a hint, and a stale entry costs only the affinity a plain rendezvous choice would also miss).
    """

    def __init__(self, capacity: int = 200_000):
        self.capacity = capacity
        self._where: OrderedDict[bytes, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._where)

    def record(self, hashes: Sequence[bytes], address: str) -> None:
        for h in hashes:
            self._where[h] = address
            self._where.move_to_end(h)
        while len(self._where) > self.capacity:
            self._where.popitem(last=False)

    def longest_match(self, hashes: Sequence[bytes]) -> tuple[str | None, int]:
        """(address, blocks) of the longest recorded prefix of `hashes`; (None, 0) when none."""
        best, blocks = None, 0
        for i, h in enumerate(hashes):
            address = self._where.get(h)
            if address is None:
                break
            best, blocks = address, i + 1
        return best, blocks

    def forget(self, address: str) -> None:
        """A replica left (or restarted with an empty cache): drop its entries."""
        for h in [h for h, a in self._where.items() if a == address]:
            del self._where[h]


def choose(
    token_ids: Sequence[int],
    candidates: Sequence[ReplicaLoad],
    config: RoutingConfig,
    index: PrefixIndex | None = None,
) -> Decision | None:
    """The replica for a prompt starting with token_ids, or None when there is no candidate.
    With an index, the decision is recorded in it."""
    if not candidates:
        return None
    loads = {c.address: c.load(config.kv_weight) for c in candidates}
    least = min(loads.values())
    hashes = block_hashes(token_ids, config.block_size)
    decision = _decide(hashes, loads, least, config, index)
    if index is not None and hashes:
        index.record(hashes, decision.address)
    return decision


def _decide(hashes, loads, least, config: RoutingConfig, index: PrefixIndex | None) -> Decision:
    if not hashes:
        address = min(loads, key=lambda a: (loads[a], a))
        return Decision(address, LEAST_LOADED)
    if index is not None:
        address, blocks = index.longest_match(hashes)
        if address in loads and blocks > config.affinity_blocks and loads[address] <= least + config.load_margin:
            return Decision(address, PREFIX)
    key = hashes[min(config.affinity_blocks, len(hashes)) - 1]
    for position, address in enumerate(rank(key, list(loads))):
        if loads[address] <= least + config.load_margin:
            return Decision(address, AFFINITY if position == 0 else OVERFLOW, position)
    raise AssertionError("unreachable: the least-loaded replica is always within the margin")
