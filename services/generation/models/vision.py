"""Idefics3's image encoder (SmolVLM): a SigLIP vision transformer over 512x512 tiles and the
connector that turns each tile's patches into the decoder's image-token embeddings.

One tile of image_size² pixels is cut into (image_size / patch_size)² patches (512 / 16: 1,024), each
embedded by a strided convolution plus a learned position embedding; pre-norm encoder layers
(LayerNorm, bidirectional multi-head attention with biases, a GELU-tanh MLP) and a final LayerNorm
follow. The connector's *pixel shuffle* folds each scale_factor x scale_factor block of patches
(4 x 4) into one vector of scale_factor² times the width, and one bias-free linear projects it
into the decoder's hidden size: 1,024 patches -> 64 image tokens per tile. The decoder sees those
64 vectors where the prompt holds its 64 ``<image>`` tokens (transformers' ``inputs_merger``).

Tiles are always full here: Idefics3's image processor resizes every tile and the global view to
exactly image_size² (services/preprocess/images.py), so every patch is real and position ids are
0..N-1 (transformers' bucketized ids for partial tiles reduce to that). A partial tile is refused
rather than encoded with the wrong positions.

Weights are HF names of Idefics3ForConditionalGeneration (``model.vision_model.*``,
``model.connector.*``); computed in the runner's dtype with fp32 LayerNorm statistics as torch's
LayerNorm keeps them. Parity: tests/unit/generation/test_vision.py against transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.generation.models.config import CheckpointError

_VISION = "model.vision_model."
_PROJECTION = "model.connector.modality_projection.proj.weight"
_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh", "gelu")


@dataclass(frozen=True)
class VisionConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # a tile's side in pixels
    patch_size: int
    scale_factor: int  # the connector's pixel shuffle: scale_factor² patches per image token
    text_hidden_size: int
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"
    num_channels: int = 3

    @classmethod
    def from_hf(cls, raw: dict, path: str = "config.json") -> VisionConfig:
        """From an Idefics3 config.json (vision_config, scale_factor, text_config.hidden_size)."""
        try:
            v, text = raw["vision_config"], raw["text_config"]
            config = cls(int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"]),
                         int(v["num_attention_heads"]), int(v.get("image_size", 224)), int(v.get("patch_size", 32)),
                         int(raw.get("scale_factor", 2)), int(text["hidden_size"]),
                         float(v.get("layer_norm_eps", 1e-6)), str(v.get("hidden_act", "gelu_pytorch_tanh")),
                         int(v.get("num_channels", 3)))
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: an Idefics3 config needs vision_config and text_config ({e})") from e
        config.check(path)
        return config

    def check(self, path: str) -> None:
        side = self.image_size // self.patch_size
        if self.image_size % self.patch_size or side % self.scale_factor:
            raise CheckpointError(f"{path}: image_size {self.image_size} must be patches of {self.patch_size} "
                                  f"in groups of {self.scale_factor} per side")
        if self.hidden_size % self.num_heads:
            raise CheckpointError(f"{path}: vision hidden_size {self.hidden_size} is not a multiple of its "
                                  f"{self.num_heads} heads")
        if self.hidden_act not in _ACTIVATIONS:
            raise CheckpointError(f"{path}: vision hidden_act {self.hidden_act!r} is not supported")

    @property
    def patches_per_tile(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_tile(self) -> int:
        """The decoder's image tokens per tile (transformers' image_seq_len)."""
        return self.patches_per_tile // self.scale_factor ** 2


def vision_weight_names(config: VisionConfig) -> list[str]:
    names = [f"{_VISION}embeddings.patch_embedding.weight", f"{_VISION}embeddings.patch_embedding.bias",
             f"{_VISION}embeddings.position_embedding.weight",
             f"{_VISION}post_layernorm.weight", f"{_VISION}post_layernorm.bias", _PROJECTION]
    for i in range(config.num_layers):
        p = f"{_VISION}encoder.layers.{i}."
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                     "layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2"):
            names += [f"{p}{part}.weight", f"{p}{part}.bias"]
    return names


class VisionEncoder:
    """Tiles [N, C, S, S] -> image-token embeddings [N, tokens_per_tile, text_hidden_size]."""

    def __init__(self, config: VisionConfig, tensors: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype):
        missing = [n for n in vision_weight_names(config) if n not in tensors]
        if missing:
            raise CheckpointError(f"the vision tower lacks {len(missing)} weights, e.g. {missing[0]}")
        self.config, self.device, self.dtype = config, device, dtype
        self.w = {name[len("model."):]: tensors[name].to(device=device, dtype=dtype)
                  for name in vision_weight_names(config)}
        # One fused q/k/v projection per layer: one GEMM instead of three.
        for i in range(config.num_layers):
            p = f"vision_model.encoder.layers.{i}.self_attn."
            self.w[p + "qkv.weight"] = torch.cat([self.w.pop(f"{p}{x}_proj.weight") for x in "qkv"])
            self.w[p + "qkv.bias"] = torch.cat([self.w.pop(f"{p}{x}_proj.bias") for x in "qkv"])

    @torch.inference_mode()
    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        c = self.config
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != (c.num_channels, c.image_size, c.image_size):
            raise ValueError(f"tiles must be [N, {c.num_channels}, {c.image_size}, {c.image_size}], "
                             f"got {list(pixel_values.shape)}")
        x = pixel_values.to(device=self.device, dtype=self.dtype)
        return self.connector(self.encode(x))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The vision transformer's last hidden state after post_layernorm: [N, patches, hidden]."""
        c, w = self.config, self.w
        v = "vision_model."
        h = F.conv2d(x, w[v + "embeddings.patch_embedding.weight"], w[v + "embeddings.patch_embedding.bias"],
                     stride=c.patch_size)
        h = h.flatten(2).transpose(1, 2) + w[v + "embeddings.position_embedding.weight"]  # ids 0..N-1: full tiles
        n, t, d = h.shape
        heads, head_dim = c.num_heads, d // c.num_heads
        for i in range(c.num_layers):
            p = f"{v}encoder.layers.{i}."
            a = F.layer_norm(h, (d,), w[p + "layer_norm1.weight"], w[p + "layer_norm1.bias"], c.layer_norm_eps)
            q, k, val = F.linear(a, w[p + "self_attn.qkv.weight"], w[p + "self_attn.qkv.bias"]).split(d, dim=-1)
            q, k, val = (y.view(n, t, heads, head_dim).transpose(1, 2) for y in (q, k, val))
            a = F.scaled_dot_product_attention(q, k, val).transpose(1, 2).reshape(n, t, d)
            h = h + F.linear(a, w[p + "self_attn.out_proj.weight"], w[p + "self_attn.out_proj.bias"])
            a = F.layer_norm(h, (d,), w[p + "layer_norm2.weight"], w[p + "layer_norm2.bias"], c.layer_norm_eps)
            a = F.linear(a, w[p + "mlp.fc1.weight"], w[p + "mlp.fc1.bias"])
            a = F.gelu(a, approximate="none" if c.hidden_act == "gelu" else "tanh")
            h = h + F.linear(a, w[p + "mlp.fc2.weight"], w[p + "mlp.fc2.bias"])
        return F.layer_norm(h, (d,), w[v + "post_layernorm.weight"], w[v + "post_layernorm.bias"], c.layer_norm_eps)

    def connector(self, h: torch.Tensor) -> torch.Tensor:
        """Pixel shuffle (transformers' Idefics3Connector.pixel_shuffle) and the projection."""
        s = self.config.scale_factor
        n, t, d = h.shape
        side = int(t ** 0.5)
        # [n, rows, cols, d] -> fold s columns, swap, fold s rows, swap back: transformers' order.
        x = h.reshape(n, side, side // s, d * s).permute(0, 2, 1, 3)
        x = x.reshape(n, side // s, side // s, d * s * s).permute(0, 2, 1, 3)
        x = x.reshape(n, t // (s * s), d * s * s)
        return F.linear(x, self.w["connector.modality_projection.proj.weight"])
