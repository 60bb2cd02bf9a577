"""An image processor's rescale + normalize of uint8 pixels, shared by both services: preprocess
ships uint8 tiles (a quarter of float32's bytes) and generation turns them into the encoder's
float32 pixel values where it uses them (numpy only).

Both steps depend only on the uint8 value and the channel, so they are a 256-entry table per
channel, computed with transformers' own operations in its dtypes (rescale: a float64 product cast
to float32; normalize: float32 subtract and divide by float32 mean and std): bit-identical to
Idefics3ImageProcessorPil's pixel values (tests/unit/preprocess/test_images.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# How a tile travels on the internal stream: one MODALITY_IMAGE part, uint8 [3, S, S], C order.
TILE_MIME_TYPE = "application/x-mstar-image-tile"


@dataclass(frozen=True)
class PixelNormalization:
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @classmethod
    def from_config(cls, config: Mapping) -> PixelNormalization:
        """From a preprocessor_config.json's values (absent keys: SmolVLM's)."""
        d = cls()
        mean = tuple(float(x) for x in config.get("image_mean", d.image_mean))
        std = tuple(float(x) for x in config.get("image_std", d.image_std))
        if len(mean) != 3 or len(std) != 3 or 0.0 in std:
            raise ValueError(f"image_mean and image_std need 3 values, std nonzero; got {mean}, {std}")
        return cls(bool(config.get("do_rescale", d.do_rescale)), float(config.get("rescale_factor", d.rescale_factor)),
                   bool(config.get("do_normalize", d.do_normalize)), mean, std)

    def table(self) -> np.ndarray:
        """float32 [3, 256]: what each uint8 value of each channel becomes."""
        values = np.arange(256, dtype=np.uint8)
        x = values.astype(np.float64) * self.rescale_factor if self.do_rescale else values
        x = x.astype(np.float32)
        if not self.do_normalize:
            return np.stack([x, x, x])
        mean = np.array(self.image_mean, dtype=np.float32)
        std = np.array(self.image_std, dtype=np.float32)
        return np.stack([(x - mean[ch]) / std[ch] for ch in range(3)])

    def apply(self, tiles: np.ndarray) -> np.ndarray:
        """uint8 [..., 3, H, W] -> float32 pixel values."""
        if tiles.dtype != np.uint8 or tiles.ndim < 3 or tiles.shape[-3] != 3:
            raise ValueError(f"tiles must be uint8 [..., 3, H, W], got {tiles.dtype} {tiles.shape}")
        table = self.table()
        out = np.empty(tiles.shape, np.float32)
        for ch in range(3):
            out[..., ch, :, :] = table[ch][tiles[..., ch, :, :]]
        return out
