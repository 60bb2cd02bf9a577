"""The architecture of a decoder checkpoint (any family in models/families.py), read from GGUF
metadata or an HF config.json."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.generation.models.families import Family, family


class CheckpointError(ValueError):
    """A checkpoint the server cannot serve; the message names the file, field or tensor."""


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    family: str = "llama"  # models/families.py: which parts of the decoder are switched on
    # RoPE frequency scaling: HF's "llama3" rope parameters (factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings) as sorted (key, value) pairs, or a GGUF's rope_freqs tensor
    # (llama.cpp's form of the same thing: one divisor per frequency). kernels/reference/rotary.py.
    rope_llama3: tuple[tuple[str, float], ...] | None = None
    rope_freq_factors: tuple[float, ...] | None = None
    # Sliding-window attention (Mistral; Qwen's windowed layers): a windowed layer's row sees only the
    # last sliding_window keys. layer_types names each layer "sliding_attention" or "full_attention"
    # (HF's field); empty = every layer windowed when sliding_window is set, else none.
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    rope_local_theta: float | None = None  # windowed layers' RoPE base (Gemma 3: 10000); None = rope_theta
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma); None = head_dim

    @property
    def parts(self) -> Family:
        """The family's switches (models/families.py)."""
        return family(self.family)

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def qkv_bias(self) -> bool:
        """The family's (Qwen2): q, k and v projections carry a bias."""
        return family(self.family).qkv_bias

    @property
    def qk_norm(self) -> bool:
        """The family's (Qwen3): RMSNorm of each q and k head before RoPE."""
        return family(self.family).qk_norm

    def window(self, layer: int) -> int:
        """The layer's attention window in keys; 0 = every key (the kernels' convention)."""
        if not self.sliding_window:
            return 0
        if self.layer_types and self.layer_types[layer] != "sliding_attention":
            return 0
        return self.sliding_window

    def validate(self, source: str) -> None:
        positive = ["vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"]
        for name in positive + ["head_dim", "max_position_embeddings"]:
            if getattr(self, name) <= 0:
                raise CheckpointError(f"{source}: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"{source}: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise CheckpointError(f"{source}: head_dim {self.head_dim} must be even for RoPE")
        if self.layer_types and (len(self.layer_types) != self.num_layers
                                 or set(self.layer_types) - {"sliding_attention", "full_attention"}):
            raise CheckpointError(f"{source}: layer_types must name each of the {self.num_layers} layers "
                                  f"sliding_attention or full_attention")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
            raise CheckpointError(f"{source}: rope_freqs has {len(self.rope_freq_factors)} factors, "
                                  f"expected head_dim / 2 = {self.head_dim // 2}")

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF tensor names and shapes this architecture needs (lm_head only when untied)."""
        h, f, d = self.hidden_size, self.intermediate_size, self.head_dim
        hq, hk = self.num_heads * d, self.num_kv_heads * d
        shapes = {"model.embed_tokens.weight": (self.vocab_size, h), "model.norm.weight": (h,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            if self.parts.sandwich_norms:  # Gemma: post_attention_layernorm is the attention output's norm
                shapes |= {p + "pre_feedforward_layernorm.weight": (h,), p + "post_feedforward_layernorm.weight": (h,)}
            shapes |= {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (self.num_heads * d, h),
                p + "self_attn.k_proj.weight": (self.num_kv_heads * d, h),
                p + "self_attn.v_proj.weight": (self.num_kv_heads * d, h),
                p + "self_attn.o_proj.weight": (h, self.num_heads * d),
                p + "mlp.gate_proj.weight": (f, h),
                p + "mlp.up_proj.weight": (f, h),
                p + "mlp.down_proj.weight": (h, f),
            }
            if self.qkv_bias:
                shapes |= {p + "self_attn.q_proj.bias": (hq,), p + "self_attn.k_proj.bias": (hk,),
                           p + "self_attn.v_proj.bias": (hk,)}
            if self.qk_norm:
                shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        return shapes

    def hf_config(self, **overrides):
        """transformers' config of this architecture (the oracle the parity tests and benchmarks build;
        transformers is imported only here)."""
        import transformers

        raw = self.to_hf_dict() | overrides
        return transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)

    def _gemma_hf_dict(self) -> dict:
        """Gemma 3's own field names: a RoPE per layer kind, hidden_activation, query_pre_attn_scalar."""
        return {
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": self.rope_theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": self.rope_local_theta or self.rope_theta},
            },
            "layer_types": [("sliding_attention" if self.window(i) else "full_attention") for i in range(self.num_layers)],
            "sliding_window": self.sliding_window,
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": self.query_pre_attn_scalar or self.head_dim,
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
        }

    def to_hf_dict(self) -> dict:
        """The same architecture as the family's transformers config kwargs, model_type and
        architectures included (the parity tests build transformers' model from it)."""
        if self.rope_freq_factors is not None:
            raise ValueError("a GGUF's rope_freqs factors have no transformers config form")
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_llama3:
            rope = {**rope, "rope_type": "llama3", **dict(self.rope_llama3)}
        windows = {
            "rope_parameters": rope,
            "sliding_window": self.sliding_window,
            "use_sliding_window": self.sliding_window is not None,
            "max_window_layers": 0,  # Qwen: windows from layer 0 (layer_types says which, when given)
            **({"layer_types": list(self.layer_types)} if self.layer_types else {}),
            "hidden_act": "silu",
        }
        return {
            "model_type": self.parts.model_type,
            "architectures": [self.parts.hf_architecture],
            **(self._gemma_hf_dict() if self.family == "gemma3" else windows),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) or None,
            "attention_bias": False,
            "mlp_bias": False,
        }


def check_state_dict(config: DecoderConfig, state_dict: dict, source: str) -> None:
    """Fail with the first missing or mis-shaped tensor's name."""
    for name, shape in config.expected_shapes().items():
        tensor = state_dict.get(name)
        if tensor is None:
            raise CheckpointError(f"{source}: missing tensor {name} (expected shape {list(shape)})")
        if tuple(tensor.shape) != shape:
            raise CheckpointError(f"{source}: tensor {name} has shape {list(tensor.shape)}, expected {list(shape)}")
