"""The model families mstar serves: ONE registry, read by both loaders (HF directories and GGUF files).

Every family here is a pre-norm decoder with grouped-query attention, RoPE and a gated MLP, so
one model definition (models/llama.py) serves them all; a family only switches parts on:

    llama    LlamaForCausalLM    GGUF "llama"   plain; Llama 3.x adds "llama3" RoPE scaling (rope.py)
    mistral  MistralForCausalLM  GGUF "llama"   sliding-window attention (the kernels' `window`)
    qwen2    Qwen2ForCausalLM    GGUF "qwen2"   a bias on the q, k and v projections
    qwen3    Qwen3ForCausalLM    GGUF "qwen3"   RMSNorm of each q and k head before RoPE (QK-norm)
    gemma3   Gemma3ForCausalLM   GGUF "gemma3"  QK-norm; norms on the attention and MLP outputs too
                                                ("sandwich"); GeGLU (tanh GELU); embeddings x sqrt(H);
                                                5 windowed layers per global one, each kind its own
                                                RoPE base; norm weights stored as w, applied as 1 + w
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
    hf_model_type: str = ""  # config.json model_type when it differs from name (Gemma 3: "gemma3_text")
    # HF checkpoints store RMSNorm weights as w and apply (norm_offset + w): Gemma's 1. The model is
    # served with multipliers (the loader adds the offset once, in fp32, as HF does per call);
    # llama.cpp's converter already stored w + 1 in the GGUF.
    norm_offset: float = 0.0
    sandwich_norms: bool = False  # RMSNorm on the attention and MLP outputs before the residual add
    activation: str = "silu"  # the gate's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scaled: bool = False  # embeddings multiplied by sqrt(hidden_size)

    @property
    def model_type(self) -> str:
        return self.hf_model_type or self.name


FAMILIES = {
    f.name: f
    for f in (
        Family("llama", "LlamaForCausalLM", "llama", qkv_bias=False, qk_norm=False, gguf_qk_permuted=True),
        Family("mistral", "MistralForCausalLM", "llama", qkv_bias=False, qk_norm=False, gguf_qk_permuted=True),
        Family("qwen2", "Qwen2ForCausalLM", "qwen2", qkv_bias=True, qk_norm=False, gguf_qk_permuted=False),
        Family("qwen3", "Qwen3ForCausalLM", "qwen3", qkv_bias=False, qk_norm=True, gguf_qk_permuted=False),
        Family("gemma3", "Gemma3ForCausalLM", "gemma3", qkv_bias=False, qk_norm=True, gguf_qk_permuted=False,
               hf_model_type="gemma3_text", norm_offset=1.0, sandwich_norms=True, activation="gelu_tanh",
               embed_scaled=True),
    )
}
_BY_HF_ARCHITECTURE = {f.hf_architecture: f for f in FAMILIES.values()}
_BY_MODEL_TYPE = {f.model_type: f for f in FAMILIES.values()}
_BY_GGUF_ARCHITECTURE = {f.gguf_architecture: f for f in FAMILIES.values() if f.name != "mistral"}


def family(name: str) -> Family:
    return FAMILIES[name]


def by_hf_architecture(name: str) -> Family | None:
    return _BY_HF_ARCHITECTURE.get(name)


def by_model_type(name: str) -> Family | None:
    return _BY_MODEL_TYPE.get(name)


def by_gguf_architecture(name: str) -> Family | None:
    return _BY_GGUF_ARCHITECTURE.get(name)


def served(kind: str) -> str:
    """The names a refusal lists: "hf" (transformers classes) or "gguf" (architectures)."""
    if kind == "hf":
        return ", ".join(f.hf_architecture for f in FAMILIES.values())
    return ", ".join(sorted(_BY_GGUF_ARCHITECTURE))
