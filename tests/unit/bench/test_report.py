"""bench/report.py renders a run's results: the new columns (RSS, start-up) and the variant rows."""

from __future__ import annotations

from bench.report import render
from bench.settings import QUICK


def _row(c: int, tok_s: float, rss: float) -> dict:
    return {"concurrency": c, "tok_s": tok_s, "errors": 0, "ttft_p50_ms": 50.0, "ttft_p99_ms": 60.0,
            "itl_p50_ms": 9.0, "itl_p99_ms": 12.0, "e2e_p50_ms": 600.0, "e2e_p99_ms": 700.0, "rss_peak_mb": rss}


def _results() -> dict:
    s = {**QUICK.as_dict(), "concurrency": [1, 16]}
    numerics = {"weights": "Q4_1 x210 as codes", "activations": "float32", "kernels": "cpu", "compiled_decode": True}
    return {
        "meta": {"date": "today", "full": False, "commit": "abc", "cpu": "cpu", "cores": 2, "loadavg": "1 1 1",
                 "gguf": "m.gguf", "settings": s, "duration_s": 10.0},
        "mstar": {"http": [_row(1, 100, 1111), _row(16, 400, 1222)], "startup_s": 21.5, "rss_idle_mb": 1000,
                  "numerics": numerics,
                  "startup": {"cold": {"ready": 80.0}, "warm": {"ready": 21.5, "generation": 19.0, "preprocess": 3.0,
                                                                  "envoy_upstream": 19.5, "first_request": 21.5}}},
        "llama_server": {"http": [_row(1, 110, 555), _row(16, 300, 666)], "startup_s": 1.5, "rss_idle_mb": 500},
        "hf_generate": {"rows": [_row(1, 20, 777), _row(16, 90, 888)], "startup_s": 9.0, "load_s": 4.0,
                        "rss_idle_mb": 700},
        "mstar_variants": {"fp32": {"dtype": "float32", "quantization": "none", "levels": [1], "startup_s": 7.0,
                                    "rss_idle_mb": 1300, "http": [_row(1, 30, 1333)],
                                    "numerics": {**numerics, "compiled_decode": False}}},
    }


def test_memory_startup_variants_and_targets_are_rendered():
    doc = render(_results(), [], notes=False)
    lines = doc.splitlines()
    assert "| mstar defaults | 21.5 | 1,000 | 1,111 | 1,222 |" in lines
    assert "| llama-server | 1.5 | 500 | 555 | 666 |" in lines
    assert "| HF generate | 9.0 | 700 | 777 | 888 |" in lines
    assert "| mstar fp32 | 7.0 | 1,300 | 1,333 | – |" in lines
    assert "| mstar / llama-server | | 2.00× | 2.00× | 1.83× |" in lines
    assert "cold, on an empty Inductor cache 80.0 s" in doc
    fp32 = next(ln for ln in lines if ln.startswith("| fp32 | float32 / none |"))
    assert "| 1 | 30.0 | 0.30× | 0.27× |" in fp32 and "eager" in fp32
    assert "## Issue 12 targets" in doc
    assert any(ln.startswith("| `make run` ready on a warm cache ≤ 30 s | 21.5 s |") for ln in lines)
    assert "| mstar fp32 HTTP | 1 |" in doc  # the variant's latency row


def test_the_transport_table_shows_tokens_per_message_and_messages_per_second():
    from bench.stats import Record, summarize

    bare = [Record(start=0.0, first=0.1, end=1.0, tokens=4, gaps=[0.1, 0.1, 0.1])]  # 4 one-token messages
    stack = [Record(start=0.0, first=0.1, end=1.0, tokens=8, gaps=[0.5])]  # 2 messages of 4 tokens
    b, st = summarize(bare, 1.0), summarize(stack, 2.0)
    assert (b["chunks"], b["tokens_per_chunk"]) == (4, 1.0) and (st["chunks"], st["tokens_per_chunk"]) == (2, 4.0)
    t = {"bare": [{"concurrency": 1, **b}], "stack": [{"concurrency": 1, **st}]}
    lines = render({**_results(), "transport": t}, [], notes=False).splitlines()
    assert "| 1 | 4 | 4 | 100 % | 1.0 / 4.0 | 4 / 1 | – | 100.00 / 500.00 |" in lines
