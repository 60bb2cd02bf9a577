"""Join the hop records of one run (services/common/hop_trace.py files + the client's receive
times) into one timeline per token, and summarize each hop.

Hops, in the order a token passes them (all `time.time_ns()`, one box):

    step          generation, engine thread: the step's model run + sampling returned (extra = its start)
    gen_dispatch  generation, event loop: the step's rows split per stream (call_soon_threadsafe)
    gen_write     generation: the stream's writer hands the StreamResponse to grpc
    gen_sent      generation: grpc took it (the writer is resumed for the next message)
    pp_recv       preprocess: the ResultTokens row routed to its request's queue
    pp_detok      preprocess: the request's task detokenized it and ran the stop matcher
    pp_chunk      preprocess: the text chunk leaves the request (extra = the last token it carries)
    pp_write      preprocess: the OpenAI SSE frame of that chunk rendered, yielded toward grpc
    pp_sent       preprocess: grpc took it
    client_recv   client: the SSE data line of that chunk parsed (after Envoy, loopback both ways)

Token hops are keyed (stream key "r1f", token index) in generation and in the backend, (request
id, token index) after it (an `alias` record joins the two keys); chunk hops (request id, chunk
number). A chunk usually carries one token; a token whose chunk carries more than one (the
detokenizer held an incomplete UTF-8 sequence back) has no chunk hops of its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bench.stats import percentile

TOKEN_HOPS = ("step", "gen_dispatch", "gen_write", "gen_sent", "pp_recv", "pp_detok")
CHUNK_HOPS = ("pp_chunk", "pp_write", "pp_sent", "client_recv")
# The path a token takes, hop to hop (the rows sum to engine step end -> client). The `*_sent`
# marks are not on it: grpc reports a send done when its completion reaches the event loop, which
# is often after the peer already has the message, so they get rows of their own (SIDE).
CHAIN = ("step", "gen_dispatch", "gen_write", "pp_recv", "pp_detok", "pp_chunk", "pp_write", "client_recv")
LABELS = {
    ("step", "gen_dispatch"): "engine step end -> generation event loop (thread handoff)",
    ("gen_dispatch", "gen_write"): "-> stream writer hands the frame to grpc",
    ("gen_write", "pp_recv"): "grpc send + loopback + grpc receive + routing in preprocess",
    ("pp_recv", "pp_detok"): "request task wakes, detokenize + stop strings",
    ("pp_detok", "pp_chunk"): "-> chunk event",
    ("pp_chunk", "pp_write"): "-> OpenAI SSE frame rendered and written toward grpc (chunk written)",
    ("pp_write", "client_recv"): "grpc send + Envoy (transcoder) + loopback both ways + client parse",
}
TOTAL = ("step", "client_recv")
SIDE = {
    ("gen_write", "gen_sent"): "(side) generation's grpc send completes",
    ("pp_write", "pp_sent"): "(side) preprocess's grpc send completes",
    ("pp_sent", "client_recv"): "(side) Envoy + loopback both ways + client parse, after preprocess's send completed",
}


@dataclass
class Record:
    hop: str
    key: str
    index: int
    t_ns: int
    extra: str = ""


def parse_line(line: str) -> Record | None:
    parts = line.rstrip("\n").split("\t")
    if len(parts) < 4:
        return None
    try:
        return Record(parts[0], parts[1], int(parts[2]), int(parts[3]), parts[4] if len(parts) > 4 else "")
    except ValueError:
        return None


def read_dir(directory: Path) -> list[Record]:
    out = []
    for path in sorted(directory.glob("*.tsv")):
        for line in path.read_text().splitlines():
            if (rec := parse_line(line)) is not None:
                out.append(rec)
    return out


@dataclass
class Timelines:
    """token (request id, index) -> {hop: time_ns}; plus each measured step's run time."""

    tokens: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)
    step_run_ns: dict[int, int] = field(default_factory=dict)  # step number -> its run's duration
    multi_token_chunks: int = 0


def join(records: Iterable[Record], requests: set[str]) -> Timelines:
    """One timeline per token of the `requests` (public ids) the client measured."""
    recs = list(records)
    alias = {r.key: r.extra for r in recs if r.hop == "alias"}
    steps = {r.index: (int(r.extra), r.t_ns) for r in recs if r.hop == "step"}
    tl = Timelines()
    token_of_chunk: dict[tuple[str, int], int] = {}
    first_token_of_chunk: dict[tuple[str, int], int] = {}
    for r in recs:
        if r.hop == "pp_chunk" and r.key in requests:
            token_of_chunk[(r.key, r.index)] = int(r.extra)
    # A chunk carries the tokens after the previous chunk's last one, up to its own last.
    by_request: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (rid, chunk), last in token_of_chunk.items():
        by_request[rid].append((chunk, last))
    for rid, chunks in by_request.items():
        prev = -1
        for chunk, last in sorted(chunks):
            first_token_of_chunk[(rid, chunk)] = prev + 1
            tl.multi_token_chunks += last > prev + 1
            prev = last
    for r in recs:
        if r.hop in ("alias", "step"):
            continue
        rid = alias.get(r.key, r.key) if r.hop in ("gen_dispatch", "gen_write", "gen_sent", "pp_recv") else r.key
        if rid not in requests:
            continue
        if r.hop in CHUNK_HOPS:
            chunk = (rid, r.index)
            if chunk not in token_of_chunk or first_token_of_chunk[chunk] != token_of_chunk[chunk]:
                continue  # a multi-token chunk: no single token to charge it to
            token = (rid, token_of_chunk[chunk])
        else:
            token = (rid, r.index)
        tl.tokens.setdefault(token, {})[r.hop] = r.t_ns
        if r.hop == "gen_dispatch" and r.extra:
            step = int(r.extra)
            if step in steps:
                start, end = steps[step]
                tl.tokens[token]["step"] = end
                tl.tokens[token]["step_start"] = start
                if token[1] >= 1:  # decode steps only (token 0 comes out of the prefill)
                    tl.step_run_ns[step] = end - start
    return tl


def hop_deltas(tl: Timelines) -> dict[tuple[str, str], list[float]]:
    """Milliseconds between consecutive hops of CHAIN (then the total and the SIDE rows), per
    token that has both marks."""
    out: dict[tuple[str, str], list[float]] = {pair: [] for pair in (*LABELS, TOTAL, *SIDE)}
    for marks in tl.tokens.values():
        for a, b in out:
            if a in marks and b in marks:
                out[(a, b)].append((marks[b] - marks[a]) / 1e6)
    return out


def label(pair: tuple[str, str]) -> str:
    return LABELS.get(pair) or SIDE.get(pair) or "engine step end -> client (the whole way)"


def engine_cadence_ms(tl: Timelines) -> list[float]:
    """Time between the ends of the steps that made two consecutive tokens of one request."""
    out = []
    for (rid, index), marks in tl.tokens.items():
        prev = tl.tokens.get((rid, index - 1))
        if index >= 1 and prev and "step" in marks and "step" in prev:
            out.append((marks["step"] - prev["step"]) / 1e6)
    return out


def between_runs_ms(tl: Timelines) -> list[float]:
    """The engine loop's time outside the model between two consecutive tokens' step runs
    (report the step, apply commands, schedule): next run's start - previous run's end."""
    out = []
    for (rid, index), marks in tl.tokens.items():
        prev = tl.tokens.get((rid, index - 1))
        if index >= 1 and prev and "step_start" in marks and "step" in prev:
            out.append((marks["step_start"] - prev["step"]) / 1e6)
    return out


def share_over(values: list[float], limit_ms: float) -> float | None:
    """The fraction of `values` above limit_ms."""
    return sum(v > limit_ms for v in values) / len(values) if values else None


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": _r(percentile(values, 50)), "p99_ms": _r(percentile(values, 99))}


def itl_ms(receive_ns: dict[str, list[int]]) -> list[float]:
    """Client inter-token latency: gaps between consecutive text chunks of each request."""
    return [(b - a) / 1e6 for times in receive_ns.values() for a, b in zip(times, times[1:], strict=False)]


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
