"""End to end through the model: a tiny random-weight Llama decodes greedily with the Triton ops
(interpreter on CPU, native on CUDA) and with the torch references, and both match HF transformers.

The model is driven directly with hand-built StepMetadata (no scheduler): step 1 mixes a prompt
chunk of sequence A with the whole prompt of B, step 2 mixes A's last chunk with B's first decode
row, then both decode together, so every kernel sees chunked prefill and decode rows in one batch.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from kernels.dispatch import KernelOps
from services.generation.models.config import DecoderConfig
from services.generation.models.kv_cache import KVCache
from services.generation.models.llama import StepMetadata, Transformer

CONFIG = DecoderConfig(
    vocab_size=97, hidden_size=48, intermediate_size=67, num_layers=2, num_heads=6, num_kv_heads=2,
    head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False,
)
BLOCK_SIZE = 16
PROMPTS = {"A": list(range(3, 23)), "B": [5, 9, 2, 60, 11]}  # 20 and 5 tokens
BLOCKS = {"A": [3, 0], "B": [5]}  # deliberately out of order
N_NEW = 6


def _hf_model() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIG.hf_config(attn_implementation="eager"))
    with torch.no_grad():  # HF's init is tiny (std 0.02): widen it so logits are not near-ties
        for p in model.parameters():
            p.mul_(8.0) if p.dim() == 2 else p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def _hf_greedy(model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=N_NEW, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def _metadata(chunks: list[tuple[str, int, int]], device) -> tuple[list[int], StepMetadata]:
    """chunks: (sequence, first position, token count) for the step -> positions, metadata."""
    positions, slots, cu, ctx = [], [], [0], []
    for name, start, n in chunks:
        for pos in range(start, start + n):
            positions.append(pos)
            slots.append(BLOCKS[name][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
        cu.append(cu[-1] + n)
        ctx.append(start + n)
    tables = [BLOCKS[name] + [0] * (2 - len(BLOCKS[name])) for name, _, _ in chunks]

    def t(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device)

    meta = StepMetadata(
        positions=t(positions, torch.int64), slot_mapping=t(slots, torch.int64), block_tables=t(tables, torch.int32),
        cu_seqlens_q=t(cu, torch.int32), context_lens=t(ctx, torch.int32), logits_indices=t([c - 1 for c in cu[1:]], torch.int64),
    )
    return positions, meta


def _engine_greedy(ops: KernelOps, state_dict: dict) -> dict[str, list[int]]:
    device = ops.device
    dtype = torch.float32
    model = Transformer(CONFIG, ops, state_dict, device, dtype)
    cache = KVCache(CONFIG, num_blocks=6, block_size=BLOCK_SIZE, device=device, dtype=dtype)
    tokens = {name: list(p) for name, p in PROMPTS.items()}
    steps = [[("A", 0, 12), ("B", 0, 5)], [("A", 12, 8), ("B", 5, 1)]]
    steps += [[("A", 20 + i, 1), ("B", 6 + i, 1)] for i in range(N_NEW - 1)]
    for step in steps:
        _, meta = _metadata(step, device)
        ids = torch.tensor([tokens[n][p] for n, s, c in step for p in range(s, s + c)], device=device)
        with torch.inference_mode():
            logits = model.forward(ids, meta, cache)  # [S, V]
        n_rows = logits.shape[0]
        zeros = torch.zeros(n_rows, device=device)
        greedy = ops.sample(
            logits, zeros, torch.zeros(n_rows, dtype=torch.int64, device=device), zeros + 1, zeros,
            torch.zeros(n_rows, dtype=torch.int64, device=device), torch.zeros(n_rows, dtype=torch.int64, device=device),
        )
        for (name, start, n), token in zip(step, greedy.tolist(), strict=True):
            if start + n == len(tokens[name]):  # the chunk ended the known tokens: its sample is new
                tokens[name].append(token)
    return {name: toks[len(PROMPTS[name]) :][:N_NEW] for name, toks in tokens.items()}


@pytest.fixture(scope="module")
def hf_run():
    model = _hf_model()
    state_dict = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state_dict, {name: _hf_greedy(model, prompt) for name, prompt in PROMPTS.items()}


def test_reference_ops_decode_like_hf(hf_run):
    state_dict, hf_tokens = hf_run
    assert _engine_greedy(KernelOps.create("cpu"), state_dict) == hf_tokens


def test_triton_ops_decode_like_the_references_and_hf(triton_ops, hf_run):
    state_dict, hf_tokens = hf_run
    assert _engine_greedy(triton_ops, state_dict) == hf_tokens
