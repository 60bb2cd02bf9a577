"""The model families mstar serves: ONE registry, read by both loaders (HF directories and GGUF files).

Every family here is a pre-norm decoder with grouped-query attention, RoPE and a SwiGLU MLP, so
one model definition (models/llama.py) serves them all; a family only switches parts on:

    llama    LlamaForCausalLM    GGUF "llama"   plain; Llama 3.x adds "llama3" RoPE scaling (rope.py)
    mistral  MistralForCausalLM  GGUF "llama"   sliding-window attention (the kernels' `window`)
    qwen2    Qwen2ForCausalLM    GGUF "qwen2"   a bias on the q, k and v projections
    qwen3    Qwen3ForCausalLM    GGUF "qwen3"   RMSNorm of each q and k head before RoPE (QK-norm)
    (Qwen2/Qwen3 may window some layers: use_sliding_window, max_window_layers / layer_types)

llama.cpp's converter writes Mistral checkpoints as architecture "llama", so a GGUF names only three
families. It permutes the q/k rows of "llama" GGUFs for its interleaved RoPE and leaves Qwen's in HF
order (both use HF's rotate-half RoPE in the end), hence ``gguf_qk_permuted``.
Anything else is refused at start-up naming the checkpoint's declared architecture (the loaders:
weights/safetensors.py, weights/gguf.py). No imports: config.py reads this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str  # HF model_type; what /v1/models reports as the family
    hf_architecture: str  # config.json "architectures"; the transformers class the parity tests build
    gguf_architecture: str  # GGUF general.architecture
    qkv_bias: bool  # q, k and v projections carry a bias (o_proj never does here)
    qk_norm: bool  # RMSNorm over each q and k head (weights [D]) before RoPE
    gguf_qk_permuted: bool  # llama.cpp stored the q/k rows in its interleaved-RoPE order


FAMILIES = {
    f.name: f
    for f in (
        Family("llama", "LlamaForCausalLM", "llama", qkv_bias=False, qk_norm=False, gguf_qk_permuted=True),
        Family("mistral", "MistralForCausalLM", "llama", qkv_bias=False, qk_norm=False, gguf_qk_permuted=True),
        Family("qwen2", "Qwen2ForCausalLM", "qwen2", qkv_bias=True, qk_norm=False, gguf_qk_permuted=False),
        Family("qwen3", "Qwen3ForCausalLM", "qwen3", qkv_bias=False, qk_norm=True, gguf_qk_permuted=False),
    )
}
_BY_HF_ARCHITECTURE = {f.hf_architecture: f for f in FAMILIES.values()}
_BY_GGUF_ARCHITECTURE = {f.gguf_architecture: f for f in FAMILIES.values() if f.name != "mistral"}


def family(name: str) -> Family:
    return FAMILIES[name]


def by_hf_architecture(name: str) -> Family | None:
    return _BY_HF_ARCHITECTURE.get(name)


def by_gguf_architecture(name: str) -> Family | None:
    return _BY_GGUF_ARCHITECTURE.get(name)


def served(kind: str) -> str:
    """The names a refusal lists: "hf" (transformers classes) or "gguf" (architectures)."""
    if kind == "hf":
        return ", ".join(f.hf_architecture for f in FAMILIES.values())
    return ", ".join(sorted(_BY_GGUF_ARCHITECTURE))
