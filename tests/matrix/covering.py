"""A covering design (all-pairs, or t-wise) over a table of request parameters, with constraints.

    factors = [Factor("stream", (False, True)), Factor("n", (1, 2)), Factor("logprobs", (ABSENT, True))]
    rows = covering_rows(factors, strength=2, allowed=lambda row: ...)   # a few dozen dicts

Every combination of `strength` levels from `strength` different factors that `allowed` accepts
appears in at least one row, and every row satisfies `allowed`. The full product of a chat table
(14 factors, 2-5 levels) is millions of requests; its pairs fit in ~30 rows. `allowed` sees a
partial row (only the factors assigned so far) and must return True unless the factors it sees
already break a rule, so rules are written `"tools" not in row or ...`.

The construction is the greedy AETG one (Cohen et al., 1997): each new row starts from a tuple
not covered yet and takes, factor by factor in a shuffled order, the level that covers the most
uncovered tuples; of several candidate rows the best is kept. A seeded `random.Random` makes the
table the same on every run. Tuples no allowed row can hold are dropped (and counted).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any


class _Absent:
    """A factor level meaning: leave the field out of the body."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class Factor:
    name: str
    levels: tuple[Any, ...]


Row = dict[str, Any]
Allowed = Callable[[Row], bool]


@dataclass
class Design:
    rows: list[Row]
    tuples: int  # combinations the rows had to cover
    impossible: int  # combinations each rule allows alone but no allowed row can hold (not counted)


def _key(level: Any) -> Hashable:
    """Levels may be dicts or lists (request fragments): compare them by their repr."""
    return repr(level)


def covering_rows(factors: Sequence[Factor], strength: int = 2, allowed: Allowed = lambda row: True,
                  constrained: Collection[str] | None = None, seed: int = 0, candidates: int = 12) -> Design:
    """`constrained`: the factors `allowed` reads (None: maybe all); the others never change its answer."""
    if len({f.name for f in factors}) != len(factors):
        raise ValueError("factor names must be unique")
    space = _Space(tuple(factors), allowed, constrained)
    strength = min(strength, len(factors))
    rng = random.Random(seed)
    uncovered: set[tuple] = set()
    impossible = 0
    for group in itertools.combinations(range(len(factors)), strength):
        for choice in itertools.product(*(range(len(factors[i].levels)) for i in group)):
            picked = dict(zip(group, choice, strict=True))
            if space.completable(picked):
                uncovered.add(tuple(picked.items()))
            elif space.allows(picked):
                impossible += 1  # allowed on its own, but no allowed row holds it
    total = len(uncovered)
    rows: list[Row] = []
    while uncovered:
        best: tuple[int, dict[int, int]] | None = None
        ordered = sorted(uncovered)
        dead_ends = set()
        for _ in range(candidates):
            seed_tuple = ordered[rng.randrange(len(ordered))]
            picked = space.complete(dict(seed_tuple), uncovered, rng, strength)
            if picked is None:
                dead_ends.add(seed_tuple)
                continue
            gain = sum(1 for t in _tuples_of(picked, strength) if t in uncovered)
            if best is None or gain > best[0]:
                best = (gain, picked)
        if best is None:  # no candidate could be completed to an allowed row: drop their seeds
            uncovered -= dead_ends
            impossible += len(dead_ends)
            continue
        for t in _tuples_of(best[1], strength):
            uncovered.discard(t)
        rows.append(space.row(dict(sorted(best[1].items()))))
    return Design(rows, total, impossible)


def _tuples_of(picked: dict[int, int], strength: int):
    for group in itertools.combinations(sorted(picked), strength):
        yield tuple((i, picked[i]) for i in group)


class _Space:
    """The factors and their rule; a partial row is {factor index: level index}."""

    def __init__(self, factors: tuple[Factor, ...], allowed: Allowed, constrained: Collection[str] | None) -> None:
        self.factors = factors
        self.allowed = allowed
        names = {f.name for f in factors} if constrained is None else set(constrained)
        self.constrained = [i for i, f in enumerate(factors) if f.name in names]
        self._completable: dict[frozenset, bool] = {}

    def row(self, picked: dict[int, int]) -> Row:
        return {self.factors[i].name: self.factors[i].levels[c] for i, c in picked.items()}

    def allows(self, picked: dict[int, int]) -> bool:
        return self.allowed(self.row(picked))

    def completable(self, picked: dict[int, int]) -> bool:
        """Some allowed full row extends `picked` (depth first, remembered). Without this the greedy
        choice for one factor could leave a later one no allowed level. Only the constrained
        factors matter: the search branches over them alone."""
        key = frozenset((i, c) for i, c in picked.items() if i in self.constrained)
        known = self._completable.get(key)
        if known is None:
            known = self._completable[key] = self._search(picked)
        return known

    def _search(self, picked: dict[int, int]) -> bool:
        picked = {i: c for i, c in picked.items() if i in self.constrained}
        if not self.allows(picked):
            return False
        rest = next((i for i in self.constrained if i not in picked), None)
        if rest is None:
            return True
        return any(self.completable({**picked, rest: c}) for c in range(len(self.factors[rest].levels)))

    def complete(self, picked: dict[int, int], uncovered: set[tuple], rng: random.Random,
                 strength: int) -> dict[int, int] | None:
        """Extend a seed tuple to a full row, factor by factor, each taking the level that covers
        the most uncovered tuples (ties broken by the seeded rng)."""
        if not self.completable(picked):
            return None
        rest = [i for i in range(len(self.factors)) if i not in picked]
        rng.shuffle(rest)
        for i in rest:
            scored = []
            for c in range(len(self.factors[i].levels)):
                if not self.allows({**picked, i: c}):
                    continue
                gain = 0
                for group in itertools.combinations(list(picked), strength - 1):
                    gain += tuple(sorted([(j, picked[j]) for j in group] + [(i, c)])) in uncovered
                scored.append((gain, rng.random(), c))
            choice = next((c for *_, c in sorted(scored, reverse=True) if self.completable({**picked, i: c})),
                          None)
            if choice is None:
                return None
            picked[i] = choice
        return picked


def missing_tuples(rows: Sequence[Row], factors: Sequence[Factor], strength: int, allowed: Allowed,
                   constrained: Collection[str] | None = None) -> set[tuple]:
    """The `strength`-tuples some allowed row can hold (as ((name, level key), ...)) that no row
    holds: empty when the design covers everything it should (tests/matrix/test_covering_design.py)."""
    space = _Space(tuple(factors), allowed, constrained)
    held = {tuple(sorted((name, _key(row[name])) for name in group))
            for row in rows for group in itertools.combinations(sorted(row), strength)}
    missing = set()
    for group in itertools.combinations(range(len(factors)), strength):
        for choice in itertools.product(*(range(len(factors[i].levels)) for i in group)):
            picked = dict(zip(group, choice, strict=True))
            if space.completable(picked):
                t = tuple(sorted((name, _key(level)) for name, level in space.row(picked).items()))
                if t not in held:
                    missing.add(t)
    return missing
