"""Random-weight checkpoints of any family's shape (models/families.py), for tests, smoke runs and
transport benchmarks.

``save_hf_dir`` writes config.json + model.safetensors and ``save_gguf`` a llama.cpp GGUF (linear
weights quantized to Q4_0/Q4_1, q/k rows in llama.cpp's order), so a random model goes through the
same loaders as a real checkpoint. A Checkpoint's norm weights are the multipliers the model
applies; ``hf_tensors`` gives them as HF stores them (Gemma: less 1).
"""

from __future__ import annotations

import json
import os

import torch

from services.generation.models.config import DecoderConfig
from services.generation.weights.checkpoint import Checkpoint
from services.generation.weights.vocabulary import RAW, Vocabulary

TINY = DecoderConfig(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_ids=(2,),
)


# A synthetic vocabulary for random models, so structured output runs on them: the ids of TINY's
# bos/eos are control tokens, every printable ASCII character is a token (any JSON text can be
# spelled), and multi-character pieces let one step emit several characters, like a real BPE.
_CONTROL = ("<unk>", "<s>", "</s>")
_PIECES = (
    [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    + ['{"', '"}', '":', '": ', '", "', ', "', '"]', '["', "[]", "{}", "},", "}]", "}, {", "true", "false", "null",
       "tr", "ue", "fal", "se", "nu", "ll", "0.", ".5", "e+", "e-", "-1", '\\"', "\\n", "\\\\", "\\u00",
       "name", "age", "id", "city", "type", "value", "items", "<tool_call>", "</tool_call>", "arguments",
       "é", "ü", "ß", "Ω", "→", "日本", "语", "😀"]
    + [f"{i:02d}" for i in range(100)]
    + [a + b for a in "etaoinsrh" for b in "etaoinsrhl"]
    + [" " + w for w in ("the", "a", "of", "to", "and", "in", "is", "it", "yes", "no")]
)


def synthetic_vocabulary(vocab_size: int) -> Vocabulary:
    """Up to vocab_size - 12 tokens (the last ids stay unused, like a padded embedding)."""
    tokens = (_CONTROL + tuple(dict.fromkeys(_PIECES)))[: max(len(_CONTROL), vocab_size - 12)]
    return Vocabulary(tokens, RAW, frozenset(range(len(_CONTROL))))


def random_checkpoint(config: DecoderConfig = TINY, seed: int = 0, std: float = 0.3) -> Checkpoint:
    """Weights ~ N(0, std) (norm weights ~ 1 + noise): peaked enough that greedy argmax is stable."""
    g = torch.Generator().manual_seed(seed)
    state_dict = {}
    for name, shape in config.expected_shapes().items():
        if name.endswith(".bias"):
            state_dict[name] = 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("norm.weight"):
            state_dict[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            state_dict[name] = std * torch.randn(shape, generator=g)
    return Checkpoint(name=f"random-{config.family}", source="random", config=config, tensors=state_dict,
                      vocabulary=synthetic_vocabulary(config.vocab_size))


def hf_tensors(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """The weights as an HF checkpoint stores them: a Checkpoint holds norm weights as the served
    multipliers, Gemma's HF files store them less the family's norm_offset (families.py)."""
    offset = checkpoint.config.parts.norm_offset
    return {k: (v - offset if offset and k.endswith("norm.weight") else v).contiguous()
            for k, v in checkpoint.state_dict.items()}


def save_hf_dir(checkpoint: Checkpoint, directory: str) -> str:
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    raw = checkpoint.config.to_hf_dict()
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(raw, f, indent=1)
    save_file(hf_tensors(checkpoint), os.path.join(directory, "model.safetensors"))
    return directory


def _check_gguf_windows(c: DecoderConfig) -> None:
    """What a GGUF can say of windows: every layer or none, or Gemma 3's fixed pattern (weights/gguf.py)."""
    from services.generation.weights.gguf import gemma3_layer_types

    windows = {c.window(i) for i in range(c.num_layers)}
    if c.family == "gemma3":
        if c.sliding_window and c.layer_types != gemma3_layer_types(c.num_layers):
            raise ValueError("a Gemma 3 GGUF has one global layer every 6th, the rest windowed")
        if c.rope_local_theta not in (None, 10000.0) or c.query_pre_attn_scalar not in (None, c.head_dim):
            raise ValueError("a Gemma 3 GGUF's local RoPE base is 10000 and its query scale head_dim ** -0.5")
    elif c.layer_types and len(windows) > 1:
        raise ValueError("a GGUF windows every layer or none: no layer_types")


def save_gguf(checkpoint: Checkpoint, path: str, linear_type: str = "Q4_1", head_type: str | None = None) -> str:
    """Write a GGUF as llama.cpp's converter does for the checkpoint's family: 2-D projection weights
    as linear_type, everything else F32, q/k rows permuted for "llama" files, Llama 3 scaling as rope_freqs."""
    import gguf
    from gguf.quants import quantize

    from kernels.reference.rotary import llama3_freq_factors
    from services.generation.models.families import family
    from services.generation.weights.gguf import gguf_name, permute_qk

    c = checkpoint.config
    _check_gguf_windows(c)
    fam = family(c.family)
    writer = gguf.GGUFWriter(path, fam.gguf_architecture)
    writer.add_block_count(c.num_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    if c.sliding_window:
        writer.add_sliding_window(c.sliding_window)
    if c.bos_token_id is not None:
        writer.add_bos_token_id(c.bos_token_id)
    if c.eos_token_ids:
        writer.add_eos_token_id(c.eos_token_ids[0])
    if c.rope_llama3:
        factors = llama3_freq_factors(c.head_dim, c.rope_theta, **dict(c.rope_llama3))
        writer.add_tensor("rope_freqs.weight", torch.tensor(factors, dtype=torch.float32).numpy())
    kind = gguf.GGMLQuantizationType[linear_type]
    for name, w in checkpoint.state_dict.items():
        if fam.gguf_qk_permuted and name.endswith("q_proj.weight"):
            w = permute_qk(w, c.num_heads)
        elif fam.gguf_qk_permuted and name.endswith("k_proj.weight"):
            w = permute_qk(w, c.num_kv_heads)
        data = w.float().contiguous().numpy()
        if ".layers." in name and w.dim() == 2:
            writer.add_tensor(gguf_name(name, fam), quantize(data, kind), raw_dtype=kind)
        elif head_type and name == "lm_head.weight":  # the real default model's head is Q8_0
            head = gguf.GGMLQuantizationType[head_type]
            writer.add_tensor(gguf_name(name, fam), quantize(data, head), raw_dtype=head)
        else:  # norms as the served multipliers: what llama.cpp writes for Gemma too (w + 1)
            writer.add_tensor(gguf_name(name, fam), data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
