"""The CPU-testable parts of the GPU check: the parity metric, the roofline, the benchmark's verdicts,
the bundle's pins and the generated-section writer."""

from __future__ import annotations

import pytest
import torch

from bench import doc_sections, gpu_bundle, parity, roofline
from bench.kernels import Row
from kernels.shapes import DEFAULT, LLAMA_3_8B
from services.generation.weights.random_init import TINY, random_checkpoint

PROMPTS = [[5, 6, 7, 8, 9, 10], [300, 1, 17], list(range(20, 45))]


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return random_checkpoint(TINY, seed=0)


def test_parity_of_the_same_model_in_fp32_is_total(tiny):
    result = parity.measure("cpu", "float32", new_tokens=8, prompts=PROMPTS, checkpoint=tiny)
    assert result.agreement == 1.0 and result.passed
    assert result.positions == 24 and result.free_running_prefix == [8, 8, 8]


def test_parity_catches_a_wrong_kernel(tiny, monkeypatch):
    import kernels.reference

    real = kernels.reference.silu_and_mul_ref
    monkeypatch.setattr(kernels.reference, "silu_and_mul_ref", lambda x: 3.0 * real(x))
    result = parity.measure("cpu", "float32", new_tokens=8, prompts=PROMPTS, checkpoint=tiny)
    assert result.agreement < 1.0 and result.disagreements
    assert not result.passed  # wrong tokens where HF's choice was clear, not near-ties


def test_decode_attention_bytes_are_the_kv_cache_plus_q_out_and_tables():
    w = roofline.decode_attention(16, 16384, DEFAULT)
    kv = 2 * 16 * 16384 * 3 * 64 * 2
    assert w.bytes == kv + 2 * 16 * 9 * 64 * 2 + 16 * 1024 * 4
    assert w.bound == "memory" and w.seconds == pytest.approx(w.bytes / 4.8e12)
    assert roofline.decode_attention(16, 16384, LLAMA_3_8B).bytes > 5 * w.bytes  # 8 KV heads of 128


def test_prefill_is_compute_bound_and_the_draw_integer_bound():
    assert roofline.prefill_attention(2048).bound == "tensor"
    assert roofline.sample(256).bound == "int32"
    assert roofline.sample(256, greedy=True).bound == "memory"
    assert "decode attention" in roofline.render(roofline.default_rows())


def _row(op: str, shape: str, gbps: float, nbytes: float = 200e6) -> Row:
    us = nbytes / (gbps * 1e9) * 1e6
    return Row(op, shape, "triton", eager_us=us * 1.1, graph_us=us, bytes=nbytes, floor_us=nbytes / 4.8e12 * 1e6)


def test_the_75_percent_target_applies_to_large_16k_decode_rows_only():
    assert _row("decode attention", "SmolLM2-135M B=16 ctx=16k", 3900).target == "PASS"
    assert _row("decode attention", "SmolLM2-135M B=16 ctx=16k", 3000).target == "FAIL"
    assert _row("decode attention", "SmolLM2-135M B=1 ctx=16k", 1000, nbytes=12e6).target.startswith("n/a")
    assert _row("decode attention", "SmolLM2-135M B=16 ctx=4k", 1000).target == ""
    assert _row("rms_norm", "T=16", 10).target == ""
    assert _row("decode attention", "x ctx=16k", 3900).of_floor == pytest.approx(3900 / 4800)


def test_the_bundle_pins_what_the_lock_pins():
    pins = dict(p.split("==") for p in gpu_bundle.pinned())
    assert set(pins) == set(gpu_bundle.WHEELS)
    assert all(v[0].isdigit() for v in pins.values())


def test_generated_sections_are_replaced_or_appended(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("# T\n\n<!-- a:start -->\nold\n<!-- a:end -->\n\ntail\n")
    doc_sections.write(doc, "a", "new\nlines")
    doc_sections.write(doc, "b", "appended")
    assert doc_sections.read(doc, "a") == "new\nlines" and doc_sections.read(doc, "b") == "appended"
    assert doc.read_text().startswith("# T\n\n<!-- a:start -->\nnew\nlines\n<!-- a:end -->\n\ntail\n")
    assert doc_sections.read(doc, "c") is None
