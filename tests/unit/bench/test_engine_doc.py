"""docs/benchmarks-engine.md holds the latest engine run, not a journal: bench.engine replaces its
device's generated section and keeps the hand-written method around it."""

from pathlib import Path

import torch

from bench import doc_sections, engine

DOC = Path(__file__).resolve().parents[3] / "docs" / "benchmarks-engine.md"


def test_the_doc_holds_one_cpu_run_in_the_section_bench_engine_writes():
    text = DOC.read_text()
    assert text.count("<!-- engine-cpu:start -->") == 1
    body = doc_sections.read(DOC, "engine-cpu")
    assert body is not None and body.startswith("## Engine throughput (")
    assert text.count("## Engine throughput (") == 1  # no earlier runs outside the section


def test_a_new_run_replaces_its_devices_run_and_keeps_the_rest(tmp_path):
    doc = tmp_path / "benchmarks-engine.md"
    doc.write_text(DOC.read_text())
    engine.record(doc, torch.device("cpu"), "## Engine throughput (2099-01-01 00:00, cpu)\n\n| new |\n")
    engine.record(doc, torch.device("cuda"), "## Engine throughput (2099-01-01 00:01, cuda)\n")
    engine.record(doc, torch.device("cpu"), "## Engine throughput (2099-01-02 00:00, cpu)\n\n| newer |\n")
    text = doc.read_text()
    assert text.count("## Engine throughput (") == 2
    assert doc_sections.read(doc, "engine-cpu") == "## Engine throughput (2099-01-02 00:00, cpu)\n\n| newer |"
    assert doc_sections.read(doc, "engine-cuda") == "## Engine throughput (2099-01-01 00:01, cuda)"
    assert text.startswith("# Engine benchmark") and "## How to reproduce" in text
