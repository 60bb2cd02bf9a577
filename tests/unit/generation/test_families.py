"""Every family in models/families.py against transformers' own model of it (the oracle), on tiny
random-init checkpoints written to disk and read back by the real loaders (HF directory and GGUF):
logits within fp32 tolerance, greedy continuations identical alone and inside a batch, on the
reference kernels (the exact HF path) and the serving cpu kernels.

    llama3   Llama with "llama3" RoPE scaling (rope_parameters), and as a GGUF with rope_freqs
    mistral  a sliding window of 16 keys on every layer (prompts and continuations cross it, pages of 4)
    qwen2    q/k/v bias
    qwen3    QK-norm, one full and one windowed layer (layer_types)
    gemma3   six layers (five windowed of 8 keys, RoPE base 10^4; one global, 10^6), QK-norm, sandwich
             norms stored as w (served as 1 + w), GeGLU, sqrt(H)-scaled tied embeddings, head_dim 32
             with a query scale of its own (query_pre_attn_scalar)
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from generation_helpers import drive, make_engine

from services.generation.models.config import CheckpointError
from services.generation.sampling_params import SamplingParams
from services.generation.weights.gguf import gemma3_layer_types, load_gguf
from services.generation.weights.random_init import (
    TINY,
    hf_tensors,
    random_checkpoint,
    save_gguf,
    save_hf_dir,
)
from services.generation.weights.safetensors import load_hf_dir

transformers = pytest.importorskip("transformers")

LLAMA3 = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
          ("original_max_position_embeddings", 32))
VARIANTS = {
    "llama3": dataclasses.replace(TINY, rope_theta=500000.0, rope_llama3=LLAMA3),
    "mistral": dataclasses.replace(TINY, family="mistral", sliding_window=16),
    "qwen2": dataclasses.replace(TINY, family="qwen2", rope_theta=1000000.0),
    "qwen3": dataclasses.replace(TINY, family="qwen3", tie_word_embeddings=True, sliding_window=8,
                                 layer_types=("full_attention", "sliding_attention")),
    "gemma3": dataclasses.replace(TINY, family="gemma3", num_layers=6, head_dim=32, rms_norm_eps=1e-6,
                                  tie_word_embeddings=True, rope_theta=1000000.0, rope_local_theta=10000.0,
                                  sliding_window=8, layer_types=gemma3_layer_types(6), query_pre_attn_scalar=24),
}
PROMPTS = [[5, 6, 7, 8, 9, 10], [300, 1, 17], list(range(20, 57)), [42]]
ORACLE = {"dtype": "float32", "quantization": "none"}


def hf_model(checkpoint):
    model = transformers.AutoModelForCausalLM.from_config(checkpoint.config.hf_config()).eval()
    assert type(model).__name__ == checkpoint.config.hf_config().architectures[0]
    missing, unexpected = model.load_state_dict(hf_tensors(checkpoint), strict=False)
    assert not unexpected and all("lm_head" in m for m in missing)
    model.tie_weights()
    return model


def hf_greedy(model, prompt, n):
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def engine_greedy(engine, prompts, n):
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(i, p, params)
    tokens, _, failed, _ = drive(engine)
    assert not failed
    return [tokens[i] for i in range(len(prompts))]


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def written(request, tmp_path_factory):
    """(variant, the checkpoint as the HF loader reads it back from its directory)."""
    directory = tmp_path_factory.mktemp(request.param)
    save_hf_dir(random_checkpoint(VARIANTS[request.param], seed=3), str(directory))
    return request.param, load_hf_dir(str(directory))


def test_the_loader_reads_back_the_family_and_its_parts(written):
    name, checkpoint = written
    assert checkpoint.config == VARIANTS[name]


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
def test_greedy_matches_transformers_alone_and_in_a_batch(written, kernels):
    _, checkpoint = written
    numerics = ORACLE if kernels == "reference" else {**ORACLE, "kernels": "cpu"}
    model = hf_model(checkpoint)
    expected = [hf_greedy(model, p, 12) for p in PROMPTS]
    engine = make_engine(checkpoint, **numerics)
    assert engine.runner.numerics.kernels == kernels
    assert [engine_greedy(engine, [p], 12)[0] for p in PROMPTS] == expected
    batched = make_engine(checkpoint, num_blocks=128, max_num_batched_tokens=24, **numerics)
    assert engine_greedy(batched, PROMPTS, 12) == expected


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
def test_a_mistral_sequence_outgrows_the_pool_and_still_matches_transformers(kernels):
    """Every layer windowed: blocks a sequence has passed go back to the pool (block_manager.py's
    reuse_passed), so two 100-token prompts + 40 tokens each run on 12 blocks of 4 (47 usable
    tokens) at once, with transformers' greedy tokens; without the reuse, KV_CACHE_TOO_SMALL."""
    checkpoint = random_checkpoint(VARIANTS["mistral"], seed=3)
    model = hf_model(checkpoint)
    prompts = [list(range(20, 120)), list(range(300, 400))]
    expected = [hf_greedy(model, p, 40) for p in prompts]
    numerics = ORACLE if kernels == "reference" else {**ORACLE, "kernels": "cpu"}
    engine = make_engine(checkpoint, num_blocks=12, max_num_batched_tokens=8, **numerics)
    assert engine.block_manager.null_block_id == 11 and engine.block_manager.num_sequence_tokens == float("inf")
    assert engine_greedy(engine, prompts, 40) == expected
    assert engine.block_manager.num_free_blocks == 11


def test_prefill_logits_match_transformers(written):
    _, checkpoint = written
    prompt = list(range(3, 40))
    with torch.inference_mode():
        expected = hf_model(checkpoint)(torch.tensor([prompt])).logits[0, -1]
    engine = make_engine(checkpoint, **ORACLE)
    engine.add_request(0, prompt, SamplingParams(temperature=0.0, max_tokens=1, logprobs=20))
    tokens, completed, failed, steps = drive(engine)
    assert not failed
    top = next(t for out in steps for t in out.tokens if t.key == 0).logprobs
    assert top.top_token_ids[0] == int(expected.argmax())
    want = torch.log_softmax(expected.float(), -1)[top.top_token_ids]
    torch.testing.assert_close(torch.tensor(top.top_logprobs), want, rtol=0, atol=1e-4)


def test_windows_reach_the_layers_and_keep_them_off_the_fused_stack():
    engine = make_engine(random_checkpoint(VARIANTS["qwen3"], seed=3), kernels="cpu")
    assert [b.attention.window for b in engine.runner.model.blocks] == [0, 8]
    assert engine.runner.max_model_len == TINY.max_position_embeddings


def gguf_form(name):
    """The variant as a GGUF can say it: windows on every layer or none (qwen3's mixed layers are an
    HF-only form), except Gemma 3's fixed pattern with llama.cpp's query scale (head_dim)."""
    if name == "gemma3":
        return dataclasses.replace(VARIANTS[name], query_pre_attn_scalar=None)
    return dataclasses.replace(VARIANTS[name], sliding_window=None, layer_types=())


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "llama3", "mistral", "gemma3"])
def test_a_gguf_of_the_family_serves_the_same_tokens_as_its_directory(name, tmp_path):
    """What llama.cpp's converter writes (qwen2/qwen3 q/k rows unpermuted, Llama 3's scaling as
    rope_freqs, Gemma's norms as 1 + w and four of them per layer) reads back as the same model:
    greedy tokens equal on dequantized F32 weights."""
    checkpoint = random_checkpoint(gguf_form(name), seed=3)
    gguf = load_gguf(save_gguf(checkpoint, str(tmp_path / "m.gguf"), linear_type="F32"))
    # llama.cpp writes Mistral as "llama" (families.py); the window travels as attention.sliding_window
    assert gguf.config.family == ("llama" if name == "mistral" else checkpoint.config.family)
    assert gguf.config.sliding_window == checkpoint.config.sliding_window
    assert [gguf.config.window(i) for i in range(6)][:gguf.config.num_layers] == \
        [checkpoint.config.window(i) for i in range(checkpoint.config.num_layers)]
    assert (gguf.config.qkv_bias, gguf.config.qk_norm) == (checkpoint.config.qkv_bias, checkpoint.config.qk_norm)
    for key, value in checkpoint.state_dict.items():
        torch.testing.assert_close(gguf.state_dict[key], value, rtol=0, atol=0, msg=key)
    expected = engine_greedy(make_engine(checkpoint, **ORACLE), PROMPTS, 12)
    assert engine_greedy(make_engine(gguf, **ORACLE), PROMPTS, 12) == expected


def test_a_quantized_qwen_gguf_serves_its_codes_on_the_per_op_path(tmp_path):
    """Q4_1 codes through the cpu kernels' quant_matmul plus the bias; decoder_stack has no bias,
    so the fused step is not chosen for it."""
    checkpoint = random_checkpoint(VARIANTS["qwen2"], seed=3)
    gguf = load_gguf(save_gguf(checkpoint, str(tmp_path / "m.gguf"), linear_type="Q4_1"))
    engine = make_engine(gguf, kernels="cpu")
    assert engine.runner.numerics.quantized and engine.runner.step.name != "fused"
    oracle = make_engine(gguf, **ORACLE)
    assert engine_greedy(engine, PROMPTS[:2], 8) == engine_greedy(oracle, PROMPTS[:2], 8)


@pytest.mark.parametrize("edit, message", [
    ({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox"}, "GPTNeoXForCausalLM"),
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "llama"}, "does not match"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope type 'yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "factor"),
    ({"mlp_bias": True}, "mlp_bias"),
])
def test_an_unsupported_checkpoint_is_refused_naming_what(tmp_path, edit, message):
    directory = save_hf_dir(random_checkpoint(TINY), str(tmp_path))
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | edit))
    with pytest.raises(CheckpointError, match=message):
        load_hf_dir(directory)


def test_window_released_kv_leaves_every_later_token_exact():
    """Gemma's windowed layers give back the pages of blocks they never read again (block_manager.py's
    window release) while the request runs; then a longer prompt over the same conversation (a
    prefix-cache hit whose window is intact) and one that shares only its first blocks (whose
    windowed K/V are gone: recomputed) still decode transformers' tokens."""
    checkpoint = random_checkpoint(VARIANTS["gemma3"], seed=3)
    model = hf_model(checkpoint)
    engine = make_engine(checkpoint, **ORACLE)
    released = []
    release = engine.runner.release_window_blocks
    engine.runner.release_window_blocks = lambda ids: released.append(release(ids)) or released[-1]
    first = list(range(20, 60))
    out = engine_greedy(engine, [first], 12)[0]
    assert out == hf_greedy(model, first, 12)
    assert engine.runner.kv_cache.resident_on_write and sum(released) > 0
    hits_before = engine.block_manager.num_prefix_hit_tokens
    longer, diverging = first + out + [7, 8, 9], first[:10] + [400, 401, 402]
    assert engine_greedy(engine, [longer], 8)[0] == hf_greedy(model, longer, 8)
    assert engine.block_manager.num_prefix_hit_tokens - hits_before >= 40  # the conversation was reused
    assert engine_greedy(engine, [diverging], 8)[0] == hf_greedy(model, diverging, 8)
