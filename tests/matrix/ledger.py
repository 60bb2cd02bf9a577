"""What the matrix sent and saw: requests by surface and source, reply shapes (status × surface ×
streamed), the distinct failures (each with its first reproducer), the refusal rules schema-drawn
bodies met, and every restart of a stack process. `summary()` is what `make fuzz` writes to
build/matrix-summary.json and docs/reliability.md quotes."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.matrix.exchange import Case, Outcome

SUMMARY_PATH = Path(__file__).resolve().parents[2] / "build" / "matrix-summary.json"


@dataclass
class Failure:
    surface: str
    source: str
    problem: str
    case: Case
    status: int
    reply: str
    count: int = 1

    def describe(self) -> str:
        return (f"[{self.surface} / {self.source}] {self.problem} (x{self.count})\n"
                f"    request: {self.case.reproducer()}\n    reply: {self.status} {self.reply}")


@dataclass
class Ledger:
    shapes: Counter = field(default_factory=Counter)  # (surface, "stream"/"json", status)
    sources: Counter = field(default_factory=Counter)  # (surface, source)
    refusal_rules: Counter = field(default_factory=Counter)  # (surface, rule) of schema-drawn 4xx
    failures: dict[tuple[str, str, str], Failure] = field(default_factory=dict)
    restarts: list[str] = field(default_factory=list)  # a stack process exited (the supervisor restarted it)
    stack_problems: list[str] = field(default_factory=list)  # KV not back to idle, a replaced process
    engine_errors: int = 0  # requests the engine ended INTERNAL/UNKNOWN (its own metrics)
    not_run: int = 0
    seconds: float = 0.0
    slowest: list[tuple[float, str]] = field(default_factory=list)  # (seconds, reproducer), the 5 slowest

    def record(self, case: Case, outcome: Outcome, problems: list[str], rule: str | None = None) -> None:
        self.shapes[(case.surface, "stream" if case.streamed else "json", outcome.status or "no reply")] += 1
        self.sources[(case.surface, case.source)] += 1
        self.slowest = sorted([*self.slowest, (round(outcome.seconds, 2), case.reproducer()[:300])], reverse=True)[:5]
        if rule is not None:
            self.refusal_rules[(case.surface, rule)] += 1
        for problem in problems:
            key = (case.surface, case.source, _fold(problem))
            if key in self.failures:
                self.failures[key].count += 1
            else:
                self.failures[key] = Failure(case.surface, case.source, problem, case, outcome.status,
                                             outcome.quote())

    def merge(self, other: Ledger) -> None:
        self.shapes.update(other.shapes)
        self.sources.update(other.sources)
        self.refusal_rules.update(other.refusal_rules)
        for key, failure in other.failures.items():
            if key in self.failures:
                self.failures[key].count += failure.count
            else:
                self.failures[key] = failure
        self.restarts += other.restarts
        self.stack_problems += other.stack_problems
        self.engine_errors += other.engine_errors
        self.not_run += other.not_run
        self.seconds += other.seconds
        self.slowest = sorted([*self.slowest, *other.slowest], reverse=True)[:5]

    @property
    def requests(self) -> int:
        return sum(self.sources.values())

    @property
    def clean(self) -> bool:
        return not (self.failures or self.restarts or self.stack_problems or self.engine_errors or self.not_run)

    def five_hundreds(self) -> int:
        return sum(n for (_, _, status), n in self.shapes.items() if isinstance(status, int) and status >= 500)

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "not_run": self.not_run,
            "seconds": round(self.seconds, 1),
            "5xx": self.five_hundreds(),
            "restarts": self.restarts,
            "stack_problems": self.stack_problems,
            "engine_errors": self.engine_errors,
            "by_source": {f"{s} {src}": n for (s, src), n in sorted(self.sources.items())},
            "shapes": {f"{s} {kind} {status}": n for (s, kind, status), n in sorted(self.shapes.items(), key=str)},
            "slowest": self.slowest,
            "refusal_rules": {f"{s} {rule}": n for (s, rule), n in sorted(self.refusal_rules.items())},
            "failures": [{"surface": f.surface, "source": f.source, "problem": f.problem, "count": f.count,
                          "status": f.status, "request": f.case.reproducer(), "reply": f.reply}
                         for f in self.failures.values()],
        }

    def text(self) -> str:
        lines = [f"{self.requests} requests in {self.seconds:.0f} s, {self.five_hundreds()} 5xx, "
                 f"{len(self.failures)} distinct failures, {len(self.restarts)} restarts, "
                 f"{self.engine_errors} engine errors, {self.not_run} not run"]
        lines += [f.describe() for f in self.failures.values()]
        lines += [f"restart: {r}" for r in self.restarts] + [f"stack: {p}" for p in self.stack_problems]
        return "\n".join(lines)

    def table(self) -> str:
        """Status × surface × streamed, as the markdown table docs/reliability.md carries."""
        statuses = sorted({status for (_, _, status) in self.shapes}, key=str)
        rows = sorted({(s, kind) for (s, kind, _) in self.shapes})
        out = ["| surface | reply | " + " | ".join(str(s) for s in statuses) + " |",
               "|---|---|" + "---|" * len(statuses)]
        for surface, kind in rows:
            cells = [str(self.shapes.get((surface, kind, status), "")) for status in statuses]
            out.append(f"| {surface} | {kind} | " + " | ".join(cells) + " |")
        return "\n".join(out)

    def write(self, path: Path = SUMMARY_PATH) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**self.summary(), "table": self.table()}, indent=2, ensure_ascii=False))
        return path


def _fold(problem: str) -> str:
    """One failure, however many requests show it: numbers folded (indices, ports, counts); the
    field names a problem quotes are kept, so two fields failing alike are two failures."""
    return re.sub(r"\d+", "…", problem)
