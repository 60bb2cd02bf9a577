"""Per-request records and their summary (TTFT, inter-token latency, e2e, throughput)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Record:
    """One request as the client saw it. Times are perf_counter seconds."""

    start: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)  # between consecutive token-bearing chunks
    error: str | None = None
    _last: float | None = None

    def on_tokens(self, now: float, n: int) -> None:
        if n <= 0:
            return
        if self.first is None:
            self.first = now
        elif self._last is not None:
            self.gaps.append(now - self._last)
        self._last = now
        self.tokens += n


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100]; None for no data."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(records: list[Record], wall_s: float, cpu_s: float | None = None) -> dict:
    ok = [r for r in records if r.error is None and r.end is not None]
    ttft = [r.first - r.start for r in ok if r.first is not None]
    e2e = [r.end - r.start for r in ok]
    gaps = [g for r in ok for g in r.gaps]
    tokens = sum(r.tokens for r in ok)
    chunks = sum(len(r.gaps) + 1 for r in ok if r.first is not None)  # token-bearing messages
    out = {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "first_error": next((r.error for r in records if r.error), None),
        "output_tokens": tokens,
        "wall_s": wall_s,
        "tok_s": tokens / wall_s if wall_s > 0 else 0.0,
        "req_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "chunks": chunks,
        "tokens_per_chunk": tokens / chunks if chunks else None,
    }
    for name, xs in (("ttft", ttft), ("itl", gaps), ("e2e", e2e)):
        out[f"{name}_p50_ms"] = _ms(percentile(xs, 50))
        out[f"{name}_p99_ms"] = _ms(percentile(xs, 99))
    if cpu_s is not None:
        out["server_cpu_s"] = cpu_s
        out["server_cpu_ms_per_token"] = 1e3 * cpu_s / tokens if tokens else None
    return out


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 2)
