"""Issue 12's targets, evaluated on one run's results (the dict bench/run.py writes to
docs/benchmarks.json): each target's measured value, its ratio and whether it was met.
Pure functions of that dict, so the verdicts can be recomputed from any saved run."""

from __future__ import annotations

from dataclasses import dataclass

LLAMA_AT_1 = 1.0  # through Envoy vs llama-server at 1 stream: tok/s and ITL p50
LLAMA_AT_WIDE = 1.5  # ... at 16 and 64 streams: tok/s
WIDE_LEVELS = (16, 64)
RSS_VS_LLAMA = 2.0  # mstar's three processes vs llama-server, peak RSS at the same load
TRANSPORT = 0.5  # null-engine stack vs the bare grpc.aio ceiling, at every level
READY_WARM_S = 30.0  # `make run` ready on a warm cache
ENGINE_VS_HF = 5.0  # engine alone vs HF generate fp32 at 16 sequences (bench/engine.py, not this run)


@dataclass(frozen=True)
class Verdict:
    target: str  # the target in words, e.g. "tok/s vs llama-server at 16 streams ≥ 1.5×"
    value: str  # what was measured, in words
    ratio: float | None  # the measured ratio the target is about; None when not measured
    met: bool | None  # None: not measured in this run

    @property
    def verdict(self) -> str:
        return "not measured" if self.met is None else ("met" if self.met else "missed")


def _row(node: dict | None, key: str, c: int) -> dict | None:
    row = next((r for r in (node or {}).get(key) or [] if r.get("concurrency") == c), None)
    return row if row and not row.get("errors") else None


def _mstar_key(m: dict) -> str:
    """The series compared with the peers: HTTP through Envoy, or gRPC when HTTP failed."""
    return "http" if m.get("http") else "grpc"


def _at_least(target: str, value: str, ratio: float | None, want: float) -> Verdict:
    return Verdict(target, value, ratio, None if ratio is None else ratio >= want)


def evaluate(res: dict) -> list[Verdict]:
    m, ll = res.get("mstar") or {}, res.get("llama_server") or {}
    out: list[Verdict] = []
    for c in (1, *WIDE_LEVELS):
        want = LLAMA_AT_1 if c == 1 else LLAMA_AT_WIDE
        mr, lr = _row(m, _mstar_key(m), c), _row(ll, "http", c)
        ratio = mr["tok_s"] / lr["tok_s"] if mr and lr and lr["tok_s"] else None
        value = f"{mr['tok_s']:.1f} vs {lr['tok_s']:.1f} tok/s" if ratio is not None else "–"
        out.append(_at_least(f"tok/s through Envoy vs llama-server at {c} stream{'s' * (c > 1)} ≥ {want:.1f}×",
                             value, ratio, want))
        if c == 1:
            mi, li = (mr or {}).get("itl_p50_ms"), (lr or {}).get("itl_p50_ms")
            ratio = li / mi if mi and li else None  # ≥ 1: mstar's gap is no longer than llama-server's
            value = f"{mi:.1f} vs {li:.1f} ms" if ratio is not None else "–"
            out.append(_at_least(f"ITL p50 through Envoy vs llama-server at 1 stream ≥ {want:.1f}× "
                                 "(llama-server's ITL / mstar's)", value, ratio, want))
    out.append(Verdict(f"engine alone vs HF generate fp32 at 16 sequences ≥ {ENGINE_VS_HF:.0f}×",
                       "not part of make bench: bench/engine.py, docs/benchmarks-engine.md", None, None))
    out.append(_rss(m, ll))
    out.append(_transport(res.get("transport") or {}))
    warm = m.get("startup_s")
    kind = m.get("startup_kind", "warm")
    out.append(Verdict(f"`make run` ready on a warm cache ≤ {READY_WARM_S:.0f} s",
                       f"{warm:.1f} s" + ("" if kind == "warm" else f" ({kind})") if warm is not None else "–",
                       None if warm is None else warm / READY_WARM_S,
                       None if warm is None else warm <= READY_WARM_S))
    return out


def _rss(m: dict, ll: dict) -> Verdict:
    """The worst level and round: mstar's peak RSS over llama-server's in the same round at the same
    level ("the same load": both systems' RSS grows from round to round with what ran before, so a
    best-round pairing could set one system's round 2 against the other's round 1)."""
    target = f"RSS of mstar's three processes ≤ {RSS_VS_LLAMA:.0f}× llama-server's at the same load"
    pairs = []
    for mr in m.get(_mstar_key(m)) or []:
        lr = _row(ll, "http", mr["concurrency"])
        if not lr:
            continue
        rounds = list(zip(mr.get("rounds") or [mr], lr.get("rounds") or [lr], strict=False))
        for i, (a, b) in enumerate(rounds, 1):
            if a.get("rss_peak_mb") and b.get("rss_peak_mb"):
                where = f"{mr['concurrency']} stream{'s' * (mr['concurrency'] > 1)}" + (f", round {i}" if len(rounds) > 1 else "")
                pairs.append((a["rss_peak_mb"] / b["rss_peak_mb"], where, a["rss_peak_mb"], b["rss_peak_mb"]))
    if not pairs:
        return Verdict(target, "–", None, None)
    ratio, where, mb, lb = max(pairs)
    return Verdict(target, f"worst at {where}: {mb:,.0f} vs {lb:,.0f} MB peak", ratio, ratio <= RSS_VS_LLAMA)


def _transport(t: dict) -> Verdict:
    target = f"transport ≥ {100 * TRANSPORT:.0f} % of the bare ceiling at every level"
    pcts = []
    for b in t.get("bare") or []:
        st = _row(t, "stack", b["concurrency"])
        if st and b.get("tok_s"):
            pcts.append((st["tok_s"] / b["tok_s"], b["concurrency"]))
    if not pcts:
        return Verdict(target, "–", None, None)
    worst, c = min(pcts)
    return _at_least(target, f"lowest at {c} stream{'s' * (c > 1)}: {100 * worst:.0f} %", worst, TRANSPORT)


def render(res: dict) -> list[str]:
    """The targets as a markdown table."""
    out = ["## Issue 12 targets", "",
           "Each target of issue 12, from this run's numbers (bench/goals.py). Ratios compare measurements "
           "taken in turns in this one run; a ratio is mstar over the peer (ITL: the peer's over mstar's, so ≥ 1 "
           "is as fast), the stack over the bare server (transport) or the time over the limit (ready).", "",
           "| target | measured | ratio | verdict |", "|---|---|---:|---|"]
    for v in evaluate(res):
        ratio = "–" if v.ratio is None else f"{v.ratio:.2f}×"
        verdict = v.verdict if v.met is None else f"**{v.verdict}**"
        out.append(f"| {v.target} | {v.value} | {ratio} | {verdict} |")
    return out
