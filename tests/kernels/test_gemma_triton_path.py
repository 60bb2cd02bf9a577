"""A tiny random Gemma 3 (five windowed layers of 8 keys and a global one, QK-norm, sandwich norms,
GeGLU) decodes transformers' greedy tokens on the Triton kernels (the interpreter on CPU): the
window in the paged-attention kernel and the GeGLU kernel inside the whole model, with chunked
prefill, prompts longer than the window and pages of 4."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.generation.engine import Engine, EngineConfig
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.sampling_params import SamplingParams
from services.generation.weights.gguf import gemma3_layer_types
from services.generation.weights.random_init import TINY, hf_tensors, random_checkpoint

transformers = pytest.importorskip("transformers")

GEMMA3 = dataclasses.replace(TINY, family="gemma3", num_layers=6, head_dim=32, rms_norm_eps=1e-6,
                             tie_word_embeddings=True, rope_theta=1000000.0, rope_local_theta=10000.0,
                             sliding_window=8, layer_types=gemma3_layer_types(6))
PROMPTS = [list(range(20, 45)), [300, 1, 17]]
N_NEW = 6


def test_triton_kernels_decode_gemma3_like_transformers(triton_ops):
    checkpoint = random_checkpoint(GEMMA3, seed=3)
    model = transformers.AutoModelForCausalLM.from_config(GEMMA3.hf_config()).eval()
    model.load_state_dict(hf_tensors(checkpoint), strict=False)
    model.tie_weights()
    expected = []
    for prompt in PROMPTS:
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False, pad_token_id=0,
                                 eos_token_id=None)
        expected.append(out[0, len(prompt):].tolist())
    runner = ModelRunner(checkpoint, RunnerConfig(32, 4, "cpu", num_threads=1, dtype="float32",
                                                  quantization="none", kernels="triton"))
    assert runner.numerics.kernels == "triton"
    engine = Engine(runner, EngineConfig(32, 4, 4, 16), on_step=lambda out: None)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(i, prompt, SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True))
    tokens: dict[int, list[int]] = {0: [], 1: []}
    while engine.seqs or not engine._commands.empty():
        out = engine.run_once()
        assert not out.failed
        for event in out.tokens:
            tokens[event.key].append(event.token_id)
    assert [tokens[0], tokens[1]] == expected
