"""Greedy decoding is token-for-token identical to transformers' LlamaForCausalLM (the oracle),
alone and inside a batch of 16 (batch invariance), on a tiny random model and the real default.

The oracle path is pinned explicitly: --dtype float32 --quantization none (numerics.py then picks
the plain reference kernels, eager). The serving CPU kernels are held to the same tokens on the
tiny model (their fp32 math differs from SDPA only at ulp level), eager and compiled."""

import pytest
import torch
from generation_helpers import drive, make_engine

from services.generation.sampling_params import SamplingParams

transformers = pytest.importorskip("transformers")


def hf_model(checkpoint):
    model = transformers.AutoModelForCausalLM.from_config(checkpoint.config.hf_config()).eval()
    missing, unexpected = model.load_state_dict(checkpoint.state_dict, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing)  # tied models have no lm_head
    return model


def hf_greedy(model, prompt, max_new_tokens):
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
            pad_token_id=0, eos_token_id=None,
        )
    return out[0, len(prompt):].tolist()


def engine_greedy(engine, prompts, max_new_tokens, fillers=()):
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(("p", i), p, params)
    for i, p in enumerate(fillers):
        engine.add_request(("f", i), p, params)
    tokens, completed, failed, _ = drive(engine)
    assert not failed
    return [tokens[("p", i)] for i in range(len(prompts))]


def filler_prompts(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


ORACLE = {"dtype": "float32", "quantization": "none"}  # the exact HF path, pinned


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
def test_tiny_model_matches_hf_alone_and_in_a_batch_of_16(tiny_checkpoint, kernels):
    numerics = ORACLE if kernels == "reference" else {**ORACLE, "kernels": "cpu"}
    prompts = [[5, 6, 7, 8, 9, 10], [300, 1, 17], list(range(20, 57)), [42]]
    model = hf_model(tiny_checkpoint)
    expected = [hf_greedy(model, p, 16) for p in prompts]
    engine = make_engine(tiny_checkpoint, **numerics)
    assert engine.runner.numerics.kernels == kernels
    alone = [engine_greedy(engine, [p], 16)[0] for p in prompts]
    assert alone == expected
    # 16 concurrent sequences (4 probes + 12 fillers), chunked prefill mixing with decodes
    batched = engine_greedy(make_engine(tiny_checkpoint, num_blocks=256, max_num_batched_tokens=48, **numerics),
                            prompts, 16, filler_prompts(12, 500, seed=1))
    assert batched == expected


@pytest.mark.slow  # 40-65 s on the shared 2-core box (two 135M-parameter models in fp32)
def test_default_model_matches_hf_alone_and_in_a_batch_of_16():
    from services.generation.weights.locate import load_checkpoint

    checkpoint = load_checkpoint("default")
    # ChatML prompts of the SmolLM2 vocabulary: <|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n
    prompts = [
        [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
        [1, 4093, 198, 11328, 253, 1345, 5808, 30, 2, 198, 1, 520, 9531, 198],
        [504, 3575, 282, 4649, 314],
    ]
    model = hf_model(checkpoint)
    expected = [hf_greedy(model, p, 12) for p in prompts]
    del model
    engine = make_engine(checkpoint, num_blocks=128, block_size=16, max_num_batched_tokens=256, **ORACLE)
    assert engine.runner.numerics.kernels == "reference" and not engine.runner.numerics.quantized
    alone = [engine_greedy(engine, [p], 12)[0] for p in prompts]
    assert alone == expected
    batched = engine_greedy(engine, prompts, 12, filler_prompts(13, 49152, seed=2))
    assert batched == expected
