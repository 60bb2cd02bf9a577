"""Idefics3's image encoder (models/vision.py) against transformers' Idefics3 on a checkpoint built
here: a small random-init vision tower with the real geometry (512-pixel tiles, 16-pixel patches,
pixel shuffle 4: 64 image tokens per tile) and a tiny Llama decoder. The image-token embeddings
must equal transformers' get_image_features in fp32."""

from __future__ import annotations

import pytest
import torch

from services.generation.models.config import CheckpointError
from services.generation.models.vision import VisionConfig, VisionEncoder

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=512,
              patch_size=16)
TEXT = dict(model_type="llama", hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=128)


@pytest.fixture(scope="module")
def hf():
    import transformers

    config = transformers.Idefics3Config(vision_config=VISION, text_config=TEXT, scale_factor=4, image_token_id=100)
    torch.manual_seed(0)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # biases and norms away from their init, so a swapped part shows
        for name, p in model.named_parameters():
            if "vision_model" in name or "connector" in name:
                p.add_(torch.randn_like(p) * 0.05)
    return config, model


def test_the_image_tokens_are_transformers(hf):
    config, model = hf
    ours = VisionEncoder(VisionConfig.from_hf(config.to_dict()), model.state_dict(), torch.device("cpu"),
                         torch.float32)
    assert ours.config.tokens_per_tile == 64
    pixels = torch.rand(3, 3, 512, 512) * 2 - 1  # three tiles, normalized range
    with torch.no_grad():
        want = model.model.get_image_features(pixels[None]).pooler_output[0].view(3, 64, 48)
    got = ours(pixels)
    assert got.shape == (3, 64, 48)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The pixel shuffle's order matters: a transposed fold gives other tokens.
    assert not torch.allclose(got[:, 1:2], want[:, 8:9], atol=1e-3)


def test_tiles_of_another_size_and_broken_configs_are_refused(hf):
    config, model = hf
    ours = VisionEncoder(VisionConfig.from_hf(config.to_dict()), model.state_dict(), torch.device("cpu"),
                         torch.float32)
    with pytest.raises(ValueError, match="tiles must be"):
        ours(torch.zeros(1, 3, 256, 512))
    raw = config.to_dict()
    with pytest.raises(CheckpointError, match="vision_config"):
        VisionConfig.from_hf({"text_config": raw["text_config"]})
    with pytest.raises(CheckpointError, match="patches of"):
        VisionConfig.from_hf(raw | {"scale_factor": 3})
    with pytest.raises(CheckpointError, match="lacks"):
        VisionEncoder(VisionConfig.from_hf(raw), {}, torch.device("cpu"), torch.float32)
