"""bench/hop_table.py: joining the hop records of three processes and the client into per-token
timelines (no timing is asserted: the records are made up)."""

from __future__ import annotations

from pathlib import Path

from bench import hop_table
from bench.hop_table import Record

MS = 1_000_000


def _records(rid: str = "req-1", key: str = "r0") -> list[Record]:
    """Two tokens of one request: token 0 after the prefill (step 0), token 1 after step 1, each
    in its own chunk; every hop 1 ms after the previous one, except Envoy's (2 ms)."""
    recs = [Record("alias", key, 0, 0, rid)]
    for index in (0, 1):
        base = (index + 1) * 100 * MS
        recs += [
            Record("step", "", index, base, str(base - 10 * MS)),
            Record("gen_dispatch", key, index, base + 1 * MS, str(index)),
            Record("gen_write", key, index, base + 2 * MS),
            Record("gen_sent", key, index, base + 3 * MS),
            Record("pp_recv", key, index, base + 4 * MS),
            Record("pp_detok", rid, index, base + 5 * MS),
            Record("pp_chunk", rid, index, base + 6 * MS, str(index)),
            Record("pp_write", rid, index, base + 7 * MS),
            Record("pp_sent", rid, index, base + 8 * MS),
            Record("client_recv", rid, index, base + 10 * MS),
        ]
    return recs


def test_parse_line_roundtrip_and_garbage():
    assert hop_table.parse_line("pp_chunk\treq\t3\t12345\t7\n") == Record("pp_chunk", "req", 3, 12345, "7")
    assert hop_table.parse_line("step\t\t0\t5\t") == Record("step", "", 0, 5, "")
    assert hop_table.parse_line("torn line") is None
    assert hop_table.parse_line("x\tk\tnot-a-number\t5") is None


def test_every_hop_of_every_token_is_joined_across_keys():
    tl = hop_table.join(_records(), {"req-1"})
    assert set(tl.tokens) == {("req-1", 0), ("req-1", 1)}
    assert set(hop_table.TOKEN_HOPS + hop_table.CHUNK_HOPS) <= set(tl.tokens[("req-1", 1)])
    deltas = hop_table.hop_deltas(tl)
    expected = {("step", "gen_dispatch"): 1.0, ("gen_dispatch", "gen_write"): 1.0, ("gen_write", "pp_recv"): 2.0,
                ("pp_recv", "pp_detok"): 1.0, ("pp_detok", "pp_chunk"): 1.0, ("pp_chunk", "pp_write"): 1.0,
                ("pp_write", "client_recv"): 3.0, ("step", "client_recv"): 10.0,
                ("gen_write", "gen_sent"): 1.0, ("pp_write", "pp_sent"): 1.0, ("pp_sent", "client_recv"): 2.0}
    assert {pair: v for pair, v in deltas.items()} == {pair: [ms, ms] for pair, ms in expected.items()}
    chain = [(a, b) for a, b in zip(hop_table.CHAIN, hop_table.CHAIN[1:], strict=False)]
    assert chain == list(hop_table.LABELS)  # the chain's rows sum to the whole way
    assert sum(expected[p] for p in chain) == expected[hop_table.TOTAL]
    assert tl.step_run_ns == {1: 10 * MS}  # decode steps only: step 0 was the prefill
    assert hop_table.engine_cadence_ms(tl) == [100.0]
    assert hop_table.between_runs_ms(tl) == [90.0]  # step 1 ran from 190 ms; step 0 ended at 100 ms


def test_other_requests_are_left_out():
    recs = _records() + _records("warm-up", "r1")
    tl = hop_table.join(recs, {"req-1"})
    assert {rid for rid, _ in tl.tokens} == {"req-1"}


def test_a_chunk_of_two_tokens_has_no_chunk_hops_of_its_own():
    recs = [r for r in _records() if not (r.hop in hop_table.CHUNK_HOPS and r.index == 0)]
    recs = [Record(r.hop, r.key, 0, r.t_ns, r.extra) if r.hop in hop_table.CHUNK_HOPS else r for r in recs]
    tl = hop_table.join(recs, {"req-1"})  # chunk 0 now carries tokens 0 and 1
    assert tl.multi_token_chunks == 1
    assert not set(hop_table.CHUNK_HOPS) & set(tl.tokens[("req-1", 1)])
    assert set(hop_table.TOKEN_HOPS) <= set(tl.tokens[("req-1", 1)])


def test_read_dir_reads_every_process_file(tmp_path: Path):
    (tmp_path / "1.tsv").write_text("step\t\t0\t10\t5\n")
    (tmp_path / "2.tsv").write_text("pp_recv\tr0\t0\t20\t\nbroken\n")
    assert [r.hop for r in hop_table.read_dir(tmp_path)] == ["step", "pp_recv"]


def test_itl_is_per_request():
    assert hop_table.itl_ms({"a": [0, 2 * MS, 5 * MS], "b": [100 * MS]}) == [2.0, 3.0]


def test_share_over():
    assert hop_table.share_over([0.1, 0.6, 1.2, 0.4], 0.5) == 0.5
    assert hop_table.share_over([], 0.5) is None


def test_trace_cost_pairs_rounds_in_order():
    from bench.hops import paired_cost_ms

    rounds = {"untraced": [15.0, 21.0, 13.0], "traced": [15.5, 20.0, 13.2]}
    assert paired_cost_ms(rounds) == 0.2  # pairs +0.5, -1.0, +0.2
    assert paired_cost_ms({}) is None
