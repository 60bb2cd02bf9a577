"""Load a llama.cpp GGUF file (families.py: "llama", "qwen2", "qwen3", "gemma3"): HF-named weights,
block-quantized ones kept as the file's codes.

Tensors of the types in weights/blocks.py (Q4_0/1, Q4_K, Q5_0/1, Q5_K, Q8_0) are kept as
``BlockWeight`` codes (Checkpoint.blocks): decoding them is a reshape, and whether they are served
as codes or dequantized is the runner's choice. Every other tensor (F32 norms, Q6_K, ...) is
dequantized to fp32 (Checkpoint.tensors). GGUF lists dimensions fastest-first, so a tensor is
reshaped with its shape reversed.
Gemma's norm weights are stored as the multipliers the model applies (llama.cpp's converter wrote
1 + w), which is how a Checkpoint holds them: read as they are.
llama.cpp stores the rows of a "llama" GGUF's attn_q / attn_k permuted for its interleaved RoPE; HF uses the
"rotate_half" layout, so the permutation is undone here (see shared notes/model.md): the rows of
each head are viewed as (rows/2, 2) pairs and transposed back to (2, rows/2).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from services.common.gguf_file import GGUFFile, GGUFTensor
from services.generation.models import families
from services.generation.models.block_weight import BlockWeight
from services.generation.models.config import CheckpointError, DecoderConfig, check_state_dict
from services.generation.weights.blocks import decode_gguf_blocks
from services.generation.weights.checkpoint import Checkpoint
from services.generation.weights.vocabulary import vocabulary_from_gguf

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# Gemma's four norms per layer (sandwich_norms): llama.cpp's ffn_norm is HF's pre_feedforward_layernorm
# there, and HF's post_attention_layernorm normalizes the attention output (GGUF post_attention_norm).
_SANDWICH_LAYER_NAMES = _LAYER_NAMES | {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# What llama.cpp fixes for a Gemma 3 GGUF rather than storing (llama-model.cpp, LLM_ARCH_GEMMA3, and
# transformers' Gemma3TextConfig defaults agree): a global layer every 6th, windowed layers' RoPE base 10000.
_GEMMA3_WINDOW_PATTERN = 6
_GEMMA3_LOCAL_ROPE_BASE = 10000.0


def _layer_names(fam: families.Family | None) -> dict[str, str]:
    return _SANDWICH_LAYER_NAMES if fam is not None and fam.sandwich_norms else _LAYER_NAMES


def hf_name(gguf_name: str, fam: families.Family | None = None) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for unknown names."""
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    names = _layer_names(fam)
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{suffix}"
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    return None


def gguf_name(name: str, fam: families.Family | None = None) -> str:
    """The inverse of hf_name: 'model.layers.3.self_attn.q_proj.weight' -> 'blk.3.attn_q.weight'."""
    stem, _, suffix = name.rpartition(".")
    for short, long in _GLOBAL_NAMES.items():
        if stem == long:
            return f"{short}.{suffix}"
    _, _, layer, rest = stem.split(".", 3)
    short = next(k for k, v in _layer_names(fam).items() if v == rest)
    return f"blk.{layer}.{short}.{suffix}"


def permute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's RoPE row order from HF's: the inverse of unpermute_qk (used to write GGUFs)."""
    rows, cols = w.shape
    return w.view(num_heads, 2, rows // num_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's RoPE row permutation of a [num_heads * head_dim, in] q or k weight."""
    rows, cols = w.shape
    return w.view(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _field(reader: GGUFFile, key: str, default=None, required: bool = True):
    value = reader.fields.get(key)
    if value is None:
        if required and default is None:
            raise CheckpointError(f"GGUF metadata field {key} is missing")
        return default
    return value


def _sliding_window(reader: GGUFFile, arch: str) -> int | None:
    window = reader.fields.get(f"{arch}.attention.sliding_window")
    return int(window) if isinstance(window, int) and window > 0 else None


def gemma3_layer_types(layers: int) -> tuple[str, ...]:
    return tuple("full_attention" if (i + 1) % _GEMMA3_WINDOW_PATTERN == 0 else "sliding_attention"
                 for i in range(layers))


def _gemma3_fields(reader: GGUFFile, arch: str, layers: int, hidden: int, heads: int) -> dict:
    """Gemma 3's layer kinds, local RoPE base and attention scale, as llama.cpp derives them."""
    if _sliding_window(reader, arch) is None:
        return {}
    fields = {
        "layer_types": gemma3_layer_types(layers),
        "rope_local_theta": float(_field(reader, f"{arch}.rope.freq_base_swa", default=_GEMMA3_LOCAL_ROPE_BASE)),
    }
    if layers == 62:  # llama.cpp: the 27B scales queries by (hidden / heads) ** -0.5, the others by head_dim's
        fields["query_pre_attn_scalar"] = hidden // heads
    return fields


def _read_config(reader: GGUFFile, path: str) -> tuple[DecoderConfig, families.Family]:
    arch = str(_field(reader, "general.architecture"))
    fam = families.by_gguf_architecture(arch)
    if fam is None:
        raise CheckpointError(f"{path}: general.architecture is {arch!r}; mstar serves {families.served('gguf')}")
    names = {t.name for t in reader.tensors}
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise CheckpointError(f"{path}: missing tensor token_embd.weight")
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    if _field(reader, f"{arch}.rope.scaling.type", required=False) not in (None, "none"):
        raise CheckpointError(f"{path}: {arch}.rope.scaling.type is not supported")
    eos = _field(reader, "tokenizer.ggml.eos_token_id", required=False)
    rope_freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    layers = int(_field(reader, f"{arch}.block_count"))
    gemma = _gemma3_fields(reader, arch, layers, hidden, heads) if fam.name == "gemma3" else {}
    config = DecoderConfig(
        vocab_size=int(_field(reader, f"{arch}.vocab_size", required=False) or int(embd.dims[1])),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", default=heads)),
        head_dim=int(_field(reader, f"{arch}.attention.key_length", required=False)
                     or _field(reader, f"{arch}.rope.dimension_count", default=hidden // heads)),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", default=10000.0)),
        max_position_embeddings=int(_field(reader, f"{arch}.context_length")),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id", required=False),
        eos_token_ids=(int(eos),) if eos is not None else (),
        family=fam.name,
        # Llama 3.x: llama.cpp's converter writes the "llama3" scaling as one divisor per frequency
        rope_freq_factors=tuple(_dequantize(rope_freqs).tolist()) if rope_freqs is not None else None,
        sliding_window=_sliding_window(reader, arch),
        **gemma,
    )
    config.validate(path)
    return config, fam


_FLOATS = {"F32": np.float32, "F16": np.float16}


def _dequantize(tensor: GGUFTensor) -> np.ndarray:
    """Any tensor type the gguf package can read -> fp32 in torch's dimension order (a copy)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(reversed(tensor.dims))
    if tensor.kind in _FLOATS:
        return tensor.data.view(_FLOATS[tensor.kind]).astype(np.float32).reshape(shape)
    try:
        data = dequantize(tensor.data.reshape(-1, tensor.data.size // shape[0]) if shape else tensor.data,
                          GGMLQuantizationType[tensor.kind])
    except (NotImplementedError, ValueError, KeyError) as e:
        raise CheckpointError(f"tensor {tensor.name}: quant type {tensor.kind} is not supported ({e})") from e
    return np.ascontiguousarray(data, dtype=np.float32).reshape(shape)


def load_gguf(path: str) -> Checkpoint:
    try:
        reader = GGUFFile(path)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({e})") from e
    config, fam = _read_config(reader, path)
    tensors: dict[str, torch.Tensor] = {}
    blocks: dict[str, BlockWeight] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name, fam)
        if name is None:
            continue  # rope_freqs is read into the config (_read_config); nothing else is skipped
        kept = None
        if len(tensor.dims) == 2:
            kept = decode_gguf_blocks(tensor.kind, tensor.data, tensor.dims[1], tensor.dims[0])
        heads = None  # q and k rows come in llama.cpp's RoPE order ("llama" GGUFs only: families.py)
        if fam.gguf_qk_permuted and name.endswith("q_proj.weight"):
            heads = config.num_heads
        elif fam.gguf_qk_permuted and name.endswith("k_proj.weight"):
            heads = config.num_kv_heads
        if kept is not None:
            blocks[name] = kept if heads is None else kept.map_rows(lambda t, h=heads: unpermute_qk(t, h))
        else:
            w = torch.from_numpy(_dequantize(tensor))
            tensors[name] = w if heads is None else unpermute_qk(w, heads)
    check_state_dict(config, {**tensors, **blocks}, path)
    name = _field(reader, "general.name", required=False) or os.path.basename(path)
    return Checkpoint(name=str(name), source=path, config=config, tensors=tensors, blocks=blocks,
                      vocabulary=vocabulary_from_gguf(reader.fields))
