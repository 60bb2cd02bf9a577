"""Load a llama.cpp GGUF file into an HF-named fp32 state dict.

GGUF lists dimensions fastest-first, so a dequantized tensor is reshaped with its shape reversed.
llama.cpp stores the rows of attn_q / attn_k permuted for its interleaved RoPE; HF Llama uses the
"rotate_half" layout, so the permutation is undone here (see shared notes/model.md): the rows of
each head are viewed as (rows/2, 2) pairs and transposed back to (2, rows/2).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from services.generation.models.config import CheckpointError, LlamaConfig, check_state_dict
from services.generation.weights.checkpoint import Checkpoint
from services.generation.weights.q4 import Q4Weight, decode_gguf_q4
from services.generation.weights.vocabulary import vocabulary_from_gguf

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for unknown names."""
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    return None


def gguf_name(name: str) -> str:
    """The inverse of hf_name: 'model.layers.3.self_attn.q_proj.weight' -> 'blk.3.attn_q.weight'."""
    stem, _, suffix = name.rpartition(".")
    for short, long in _GLOBAL_NAMES.items():
        if stem == long:
            return f"{short}.{suffix}"
    _, _, layer, rest = stem.split(".", 3)
    short = next(k for k, v in _LAYER_NAMES.items() if v == rest)
    return f"blk.{layer}.{short}.{suffix}"


def permute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's RoPE row order from HF's: the inverse of unpermute_qk (used to write GGUFs)."""
    rows, cols = w.shape
    return w.view(num_heads, 2, rows // num_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's RoPE row permutation of a [num_heads * head_dim, in] q or k weight."""
    rows, cols = w.shape
    return w.view(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _field(reader, key: str, default=None, required: bool = True):
    f = reader.fields.get(key)
    if f is None:
        if required and default is None:
            raise CheckpointError(f"GGUF metadata field {key} is missing")
        return default
    return f.contents()


def _read_config(reader, path: str) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{path}: general.architecture is {arch!r}; only 'llama' is supported")
    names = {t.name for t in reader.tensors}
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise CheckpointError(f"{path}: missing tensor token_embd.weight")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    if _field(reader, "llama.rope.scaling.type", required=False) not in (None, "none"):
        raise CheckpointError(f"{path}: llama.rope.scaling.type is not supported")
    eos = _field(reader, "tokenizer.ggml.eos_token_id", required=False)
    config = LlamaConfig(
        vocab_size=int(_field(reader, "llama.vocab_size", required=False) or int(embd.shape[1])),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", default=heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", default=hidden // heads)),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, "llama.rope.freq_base", default=10000.0)),
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id", required=False),
        eos_token_ids=(int(eos),) if eos is not None else (),
    )
    config.validate(path)
    return config


def _dequantize(tensor) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        data = dequantize(tensor.data, tensor.tensor_type)
    except (NotImplementedError, ValueError, KeyError) as e:
        kind = GGMLQuantizationType(tensor.tensor_type).name
        raise CheckpointError(f"tensor {tensor.name}: quant type {kind} is not supported ({e})") from e
    data = np.ascontiguousarray(data, dtype=np.float32)
    if not data.flags.writeable:  # F32 tensors come back as views of the read-only memory map
        data = data.copy()
    return data.reshape(tuple(int(d) for d in reversed(tensor.shape)))


def load_gguf(path: str, keep_q4: bool = False) -> Checkpoint:
    """keep_q4: also keep Q4_0/Q4_1 weights as 4-bit codes (Checkpoint.q4) for the int4 matmul path."""
    from gguf import GGMLQuantizationType, GGUFReader

    try:
        reader = GGUFReader(path)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({e})") from e
    config = _read_config(reader, path)
    state_dict: dict[str, torch.Tensor] = {}
    quantized: dict[str, Q4Weight] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue  # e.g. rope_freqs: derived data the model recomputes
        w = torch.from_numpy(_dequantize(tensor))
        q4 = None
        if keep_q4 and len(tensor.shape) == 2:
            kind = GGMLQuantizationType(tensor.tensor_type).name
            q4 = decode_gguf_q4(kind, tensor.data, int(tensor.shape[1]), int(tensor.shape[0]))
        heads = None  # q and k rows come in llama.cpp's RoPE order
        if name.endswith("q_proj.weight"):
            heads = config.num_heads
        elif name.endswith("k_proj.weight"):
            heads = config.num_kv_heads
        if heads is not None:
            w = unpermute_qk(w, heads)
            if q4 is not None:
                q4 = q4.map_rows(lambda t, h=heads: unpermute_qk(t, h))
        state_dict[name] = w
        if q4 is not None:
            quantized[name] = q4
    check_state_dict(config, state_dict, path)
    name = _field(reader, "general.name", required=False) or os.path.basename(path)
    return Checkpoint(name=str(name), source=path, config=config, state_dict=state_dict, q4=quantized,
                      vocabulary=vocabulary_from_gguf(reader))
