"""bench/serving_cost.py's report: every level and transport a row, the share of the engine alone
and each process's CPU-ms per token from the measured result, written into its doc section."""

from __future__ import annotations

from bench import doc_sections
from bench.serving_cost import render


def result(null_step_ms=None):
    cpu = {"generation": 3.2, "preprocess": 0.15, "envoy": 0.05, "client": 0.1}
    out = {"levels": [1, 16], "max_tokens": 64, "null_step_ms": null_step_ms,
           "stack": {"http": {"1": {"tok_s": 170.0, "cpu_ms_per_token": cpu},
                              "16": {"tok_s": 550.0, "cpu_ms_per_token": cpu}}}}
    if null_step_ms is None:
        out["engine_alone"] = {"threads": 2, "1": {"tok_s": 200.0, "cpu_ms_per_token": 9.3},
                               "16": {"tok_s": 660.0, "cpu_ms_per_token": 3.0}}
        out["stack"]["http"]["1"]["share_of_engine_alone"] = 0.85
        out["stack"]["http"]["16"]["share_of_engine_alone"] = 550 / 660
    return out


def test_rows_carry_the_measured_numbers():
    text = render(result())
    assert "| engine alone | 16 | 660 | 100 % | 3.000 |" in text
    assert "| http | 1 | 170 | 85 % | 3.200 | 0.150 | 0.050 | 0.100 | 0.200 |" in text
    assert "| http | 16 | 550 | 83 % |" in text
    assert "the default model" in text


def test_a_token_source_run_has_no_engine_alone_and_says_what_stepped(tmp_path):
    text = render(result(null_step_ms=1.0))
    assert "null engine stepping every 1 ms" in text and "| engine alone |" not in text
    assert "| http | 16 | 550 | – |" in text
    doc = tmp_path / "b.md"
    doc_sections.write(doc, "serving-cost-null", text)
    assert doc_sections.read(doc, "serving-cost-null") == text
