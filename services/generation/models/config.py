"""The architecture of a Llama-family checkpoint, read from GGUF metadata or an HF config.json."""

from __future__ import annotations

from dataclasses import dataclass, field


class CheckpointError(ValueError):
    """A checkpoint the server cannot serve; the message names the file, field or tensor."""


@dataclass(frozen=True)
class LlamaConfig:
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

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF tensor names and shapes this architecture needs (lm_head only when untied)."""
        h, f, d = self.hidden_size, self.intermediate_size, self.head_dim
        shapes = {"model.embed_tokens.weight": (self.vocab_size, h), "model.norm.weight": (h,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
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
        return shapes

    def to_hf_dict(self) -> dict:
        """The same architecture as transformers.LlamaConfig kwargs (used by the parity tests)."""
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) or None,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        }


def check_state_dict(config: LlamaConfig, state_dict: dict, source: str) -> None:
    """Fail with the first missing or mis-shaped tensor's name."""
    for name, shape in config.expected_shapes().items():
        tensor = state_dict.get(name)
        if tensor is None:
            raise CheckpointError(f"{source}: missing tensor {name} (expected shape {list(shape)})")
        if tuple(tensor.shape) != shape:
            raise CheckpointError(f"{source}: tensor {name} has shape {list(tensor.shape)}, expected {list(shape)}")
