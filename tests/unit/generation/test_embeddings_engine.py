"""Embedding requests in the engine: prefill only, mean (default) or last-token pooling of the final
hidden states (after the final norm), L2-normalized.

The oracle is transformers' LlamaModel on the same weights (its last_hidden_state is the output of
the final norm): fp32 on CPU, so the engine's vector matches to 1e-5 per element (the two sum in
different orders; measured differences are ~1e-7). The engine runs the prompt in chunks, batched
with generation requests and other embeddings, so the test also covers chunked prefill and
batch invariance.
"""

import numpy as np
import pytest
import torch
from generation_helpers import drive, make_engine

from services.common.errors import Code
from services.common.finish import FinishReason
from services.generation.engine import Engine, EngineConfig
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.sampling_params import Embedding, SamplingParams

transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-5  # max |engine - HF| per element of the unit vector, fp32


def hf_embedding(model, prompt, dimensions=None, pooling="mean"):
    with torch.inference_mode():
        hidden = model(torch.tensor([prompt])).last_hidden_state[0]  # [T, H], after model.norm
    pooled = hidden.mean(dim=0) if pooling == "mean" else hidden[-1]
    return torch.nn.functional.normalize(pooled[:dimensions], dim=-1).numpy()


def pooling_engine(checkpoint, pooling, num_blocks=128, block_size=4, max_num_batched_tokens=24):
    # The exact HF path, pinned (the defaults may pick bf16 or a GGUF's block codes: numerics.py).
    runner = ModelRunner(checkpoint, RunnerConfig(num_blocks, block_size, "cpu", num_threads=1, pooling=pooling,
                                                  dtype="float32", quantization="none"))
    return Engine(runner, EngineConfig(num_blocks, block_size, 32, max_num_batched_tokens), on_step=lambda out: None)


def hf_base_model(checkpoint):
    model = transformers.AutoModel.from_config(checkpoint.config.hf_config()).eval()
    weights = {k.removeprefix("model."): v for k, v in checkpoint.state_dict.items() if k.startswith("model.")}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not missing and not unexpected
    return model


def vector(step_tensors, key):
    (t,) = [t for t in step_tensors if t.key == key]
    return np.frombuffer(t.data, dtype="<f4"), t.shape


def run(engine, requests):
    """requests: {key: (prompt, params)} -> (tensors by key, completed, failed, steps)."""
    for key, (prompt, params) in requests.items():
        engine.add_request(key, prompt, params)
    tokens, completed, failed, steps = drive(engine)
    tensors = [t for out in steps for t in out.tensors]
    return tensors, tokens, completed, failed, steps


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_embedding_matches_hf_hidden_states_in_a_mixed_chunked_batch(tiny_checkpoint, pooling):
    model = hf_base_model(tiny_checkpoint)
    prompts = {"short": [5, 6, 7], "long": list(range(20, 120)), "one": [42]}
    embed = SamplingParams(embedding=Embedding())
    generate = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    requests = {k: (p, embed) for k, p in prompts.items()}
    requests["gen"] = ([9, 8, 7, 6], generate)
    requests["half"] = (list(range(30, 70)), SamplingParams(embedding=Embedding(dimensions=16)))
    # 100 prompt tokens with a 24-token budget: "long" prefills in chunks next to the decode.
    engine = pooling_engine(tiny_checkpoint, pooling)
    tensors, tokens, completed, failed, _ = run(engine, requests)
    assert not failed
    for key, prompt in prompts.items():
        got, shape = vector(tensors, key)
        assert shape == (64,)
        np.testing.assert_allclose(got, hf_embedding(model, prompt, pooling=pooling), rtol=0, atol=TOLERANCE)
        assert abs(np.linalg.norm(got) - 1) < 1e-5
        done = completed[key]
        assert (done.finish_reason, done.num_output_tokens, done.num_prompt_tokens) == (FinishReason.END, 0, len(prompt))
        assert key not in tokens  # prefill only: nothing was sampled
    got, shape = vector(tensors, "half")
    assert shape == (16,)
    np.testing.assert_allclose(got, hf_embedding(model, list(range(30, 70)), 16, pooling), rtol=0, atol=TOLERANCE)
    # The generation request next to them is unaffected (same tokens as alone).
    alone = make_engine(tiny_checkpoint)
    _, alone_tokens, _, _, _ = run(alone, {"gen": requests["gen"]})
    assert tokens["gen"] == alone_tokens["gen"]


def test_mean_pooling_survives_the_prefix_cache_and_preemption(tiny_checkpoint):
    model = hf_base_model(tiny_checkpoint)
    prompt = list(range(40, 100))
    expected = hf_embedding(model, prompt)
    embed = SamplingParams(embedding=Embedding())
    # The prompt's blocks are cached by a generation request first: the embedding still pools
    # every token (it never reads cached blocks) ...
    engine = pooling_engine(tiny_checkpoint, "mean")
    run(engine, {"warm": (prompt, SamplingParams(temperature=0.0, max_tokens=2))})
    tensors, _, completed, failed, _ = run(engine, {"e": (prompt, embed)})
    assert not failed and completed["e"].num_cached_tokens == 0
    np.testing.assert_allclose(vector(tensors, "e")[0], expected, rtol=0, atol=TOLERANCE)
    # ... and a preempted embedding pools its recompute only (the running sum starts over).
    engine = pooling_engine(tiny_checkpoint, "mean", num_blocks=24, max_num_batched_tokens=16)
    long_gen = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    tensors, _, completed, failed, steps = run(engine, {"g": (list(range(5, 45)), long_gen), "e": (prompt, embed)})
    assert not failed and engine.scheduler.num_preemptions > 0
    np.testing.assert_allclose(vector(tensors, "e")[0], expected, rtol=0, atol=TOLERANCE)


def test_embedding_frees_its_blocks_in_the_step_it_ends(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint, num_blocks=32, block_size=4, max_num_batched_tokens=8)
    total = engine.block_manager.num_free_blocks
    engine.add_request("e", list(range(10, 30)), SamplingParams(embedding=Embedding()))  # 20 tokens: 3 chunks
    seen_tensor = False
    for _ in range(10):
        out = engine.run_once()
        if out.tensors:
            seen_tensor = True
            assert [c.key for c in out.completed] == ["e"]
            assert engine.block_manager.num_free_blocks == total and not engine.seqs
            break
        assert engine.block_manager.num_free_blocks < total  # holding its blocks while it prefills
    assert seen_tensor
    assert not engine.scheduler.running and not engine.scheduler.waiting


def test_embedding_aborted_mid_prefill_frees_its_blocks(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint, num_blocks=32, block_size=4, max_num_batched_tokens=8)
    total = engine.block_manager.num_free_blocks
    engine.add_request("e", list(range(10, 40)), SamplingParams(embedding=Embedding()))
    engine.run_once()
    assert engine.block_manager.num_free_blocks < total
    engine.abort("e")
    out = engine.run_once()
    assert [c.finish_reason for c in out.completed] == [FinishReason.CANCELLED] and not out.tensors
    assert engine.block_manager.num_free_blocks == total


def test_bad_embedding_requests_fail_alone(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("wide", [5, 6], SamplingParams(embedding=Embedding(dimensions=65)))  # hidden size is 64
    engine.add_request("oov", [5, 600], SamplingParams(embedding=Embedding()))
    engine.add_request("empty", [], SamplingParams(embedding=Embedding()))
    engine.add_request("ok", [5, 6], SamplingParams(embedding=Embedding(dimensions=64)))
    tensors, _, completed, failed, _ = run(engine, {})
    assert set(failed) == {"wide", "oov", "empty"} and set(completed) == {"ok"}
    assert all(f.error.code == Code.INVALID_ARGUMENT for f in failed.values())
    assert "embedding.dimensions must be in [1, 64]" in failed["wide"].error.message
    assert failed["oov"].error.reason == "TOKEN_OUT_OF_VOCAB"
    assert [t.key for t in tensors] == ["ok"]


def test_a_prompt_filling_the_whole_pool_still_embeds(tiny_checkpoint):
    # A generation request needs room for its output; an embedding only for its prompt.
    engine = make_engine(tiny_checkpoint, num_blocks=4, block_size=4, max_num_batched_tokens=64)
    tensors, _, completed, failed, _ = run(engine, {"e": (list(range(10, 26)), SamplingParams(embedding=Embedding()))})
    assert not failed and [t.key for t in tensors] == ["e"]


@pytest.mark.slow  # ~30 s: two 135M-parameter models in fp32
def test_default_model_embedding_matches_hf():
    from services.generation.weights.locate import load_checkpoint

    checkpoint = load_checkpoint("default")
    model = hf_base_model(checkpoint)
    prompts = {"a": [504, 3575, 282, 4649, 314], "b": [1, 4093, 198, 11328, 253, 1345, 5808, 30, 2, 198]}
    expected = {k: hf_embedding(model, p) for k, p in prompts.items()}
    del model
    engine = pooling_engine(checkpoint, "mean", num_blocks=64, block_size=16, max_num_batched_tokens=256)
    tensors, _, _, failed, _ = run(engine, {k: (p, SamplingParams(embedding=Embedding())) for k, p in prompts.items()})
    assert not failed
    for key in prompts:
        got, shape = vector(tensors, key)
        assert shape == (576,)
        np.testing.assert_allclose(got, expected[key], rtol=0, atol=TOLERANCE)
