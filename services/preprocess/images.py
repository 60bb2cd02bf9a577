"""The Idefics3 (SmolVLM) image processor: image bytes -> 512x512 uint8 tiles, their float32
pixel values, and the prompt text that stands for them.

It reproduces transformers' `Idefics3ImageProcessorPil` (the class transformers 5 uses when
torchvision is absent) and `Idefics3Processor.replace_image_token` bit for bit; the parity tests
(tests/unit/preprocess/test_images.py) use them as the oracle. numpy + Pillow only: the
preprocess service stays torch-free.

The pipeline, in transformers' order (each step is a separate LANCZOS resize of the previous
step's uint8 output, never one combined resize: fusing them would change the pixels):
  1. convert to RGB, compositing any transparency onto white;
  2. resize so the longest edge is `size["longest_edge"]` (2048), up *or* down: a 32x32 image
     becomes 2048x2048, so with SmolVLM's values every image is split;
  3. with splitting: resize each side up to a multiple of `max_image_size` (512), then cut
     row-major 512x512 tiles, plus a global view (step 3's image resized to 512x512);
     without splitting (or when step 3 leaves a single tile): one 512x512 view, aspect ignored;
  4. rescale (x * 1/255 in float64, then float32) and normalize ((x - mean) / std in float32).
Step 4 depends only on the uint8 value and the channel, so it is a 256-entry table per channel:
uint8 tiles can be shipped and normalized where they are used (`normalize_tiles`).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from services.common.pixel_normalization import PixelNormalization

# transformers' absolute cap on the longest edge after step 2 (MAX_IMAGE_SIZE there).
MAX_IMAGE_SIZE = 4096

FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
IMAGE_TOKEN = "<image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"


class ImageError(ValueError):
    """An image input that cannot be used: not an image, corrupt, or over a limit. The message
    is safe to show the client."""


@dataclass(frozen=True)
class ImageLimits:
    """Per-call decode caps. Pillow's global MAX_IMAGE_PIXELS is process-wide (and warns rather
    than refuses below 2x its value), so the pixel cap is checked here, on the header's size."""

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 7680 * 4320  # 8K UHD: about 133 MB as RGBA while decoding
    # Pillow formats tried, nothing else: EPS would run Ghostscript, and every extra plugin is
    # attack surface for bytes that come straight from clients.
    formats: tuple[str, ...] = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


@dataclass(frozen=True)
class ImageProcessorConfig:
    """preprocessor_config.json + processor_config.json values; the defaults are
    SmolVLM-256M-Instruct's (the Idefics3 class defaults differ: 4*364 and 364)."""

    do_convert_rgb: bool = True
    do_resize: bool = True
    size: tuple[tuple[str, int], ...] = (("longest_edge", 2048),)
    resample: int = Image.Resampling.LANCZOS  # 1, as HF configs spell it
    do_image_splitting: bool = True
    tile_size: int = 512  # max_image_size["longest_edge"]
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_seq_len: int = 64  # processor_config.json: <image> tokens per tile

    @classmethod
    def from_dict(cls, config: Mapping, processor: Mapping | None = None) -> ImageProcessorConfig:
        """From preprocessor_config.json's dict (and processor_config.json's, which carries
        image_seq_len and, in newer checkpoints, the image processor under "image_processor").
        Absent keys keep the SmolVLM default; keys the pipeline does not use are ignored."""
        merged: dict = {}
        if processor:
            merged.update(processor.get("image_processor") or {})
            merged.update({k: v for k, v in processor.items() if k != "image_processor"})
        merged.update(config)
        d = cls()
        if merged.get("do_convert_rgb", True) is not True:
            raise ValueError("do_convert_rgb must be true: the vision encoder takes 3 RGB channels")
        size = merged.get("size", dict(d.size))
        if not isinstance(size, Mapping) or not (
            "longest_edge" in size or ("height" in size and "width" in size)
        ):
            raise ValueError(f"size must have 'longest_edge' or 'height' and 'width', got {size!r}")
        size = tuple((k, _positive_int(f"size[{k!r}]", size[k])) for k in sorted(size))
        max_image_size = merged.get("max_image_size", {"longest_edge": d.tile_size})
        if not isinstance(max_image_size, Mapping) or "longest_edge" not in max_image_size:
            raise ValueError(f"max_image_size must have 'longest_edge', got {max_image_size!r}")
        resample = merged.get("resample", d.resample)
        if resample not in {int(r) for r in Image.Resampling}:
            raise ValueError(f"resample must be one of Pillow's filters 0..5, got {resample!r}")
        std = _three("image_std", merged.get("image_std", d.image_std))
        if not all(s != 0 for s in std):
            raise ValueError("image_std must not contain 0")
        return cls(
            do_resize=bool(merged.get("do_resize", d.do_resize)),
            size=size,
            resample=int(resample),
            do_image_splitting=bool(merged.get("do_image_splitting", d.do_image_splitting)),
            tile_size=_positive_int("max_image_size['longest_edge']", max_image_size["longest_edge"]),
            do_rescale=bool(merged.get("do_rescale", d.do_rescale)),
            rescale_factor=float(merged.get("rescale_factor", d.rescale_factor)),
            do_normalize=bool(merged.get("do_normalize", d.do_normalize)),
            image_mean=_three("image_mean", merged.get("image_mean", d.image_mean)),
            image_std=std,
            image_seq_len=_positive_int("image_seq_len", merged.get("image_seq_len", d.image_seq_len)),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ImageProcessorConfig:
        """From a checkpoint directory's preprocessor_config.json and processor_config.json."""
        path = Path(path)

        def read(name: str) -> dict:
            file = path / name
            return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}

        return cls.from_dict(read("preprocessor_config.json"), read("processor_config.json"))


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _three(name: str, value: object) -> tuple[float, float, float]:
    # transformers broadcasts a scalar to every channel; a list must have one value per channel.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),) * 3
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(f"{name} must be a number or 3 numbers, got {value!r}")
    return tuple(float(v) for v in value)  # type: ignore[return-value]


def decode_image(data: bytes, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """Decode client bytes to a loaded PIL image, the first frame of an animation (what
    transformers' load_image gives), EXIF orientation applied (as load_image does). The mode is
    kept: the processor's RGB conversion composites transparency onto white, where load_image's
    own convert("RGB") would drop alpha and show whatever colour the transparent pixels hold."""
    if len(data) > limits.max_bytes:
        raise ImageError(f"image is {len(data)} bytes, over the limit of {limits.max_bytes} bytes")
    if not data:
        raise ImageError("image is empty")
    try:
        # open() reads the header only; nothing is decoded until load().
        image = Image.open(io.BytesIO(data), formats=list(limits.formats))
    except Image.DecompressionBombError as exc:
        # Pillow's own process-wide cap fired first (its limit is above ours unless configured).
        raise ImageError(f"image is over the pixel limit of {limits.max_pixels} pixels ({exc})") from None
    except UnidentifiedImageError:
        raise ImageError(f"not an image in an accepted format ({', '.join(limits.formats)})") from None
    except Exception as exc:  # Pillow's plugins raise many types on hostile headers
        raise ImageError(f"corrupt image header: {exc}") from None
    width, height = image.size
    if width < 1 or height < 1:
        raise ImageError(f"image has no pixels ({width}x{height})")
    if width * height > limits.max_pixels:
        raise ImageError(
            f"image is {width}x{height} = {width * height} pixels, over the limit of {limits.max_pixels}"
        )
    try:
        image.load()  # frame 0 only, for animated GIF/WebP/APNG
        image = ImageOps.exif_transpose(image)  # a fresh single-frame image, info kept
    except MemoryError:
        raise
    except Exception as exc:  # truncated data, bad CRC, codec errors...
        raise ImageError(f"corrupt or truncated {image.format} image: {exc}") from None
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """transformers' convert_to_rgb for PIL input: alpha (a band, or a palette/"transparency"
    colour key) is composited onto opaque white; everything else is convert("RGB")."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    # transformers' _resize_output_size_rescale_to_max_len, then
    # _resize_output_size_scale_below_upper_bound; same float expressions, so the same rounding.
    aspect = width / height
    if width >= height:
        width = longest
        height = int(width / aspect)
        height += height % 2  # the short side is rounded up to even
    else:
        height = longest
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def _tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    # transformers' resize_for_vision_encoder: the long side goes up to a multiple of the tile,
    # the short side is re-derived from the aspect ratio and then also goes up to a multiple.
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def _resized_size(config: ImageProcessorConfig, height: int, width: int) -> tuple[int, int]:
    """Step 2's output size."""
    if not config.do_resize:
        return height, width
    size = dict(config.size)
    if "longest_edge" in size:
        return _longest_edge_size(height, width, size["longest_edge"])
    return size["height"], size["width"]


@dataclass(frozen=True)
class ProcessedImages:
    """The images of one call, in order. `tiles[i]` is image i's uint8 [n_i, 3, T, T] (CHW, the
    row-major grid tiles then the global view; n_i = rows*cols + 1, or 1 when not split)."""

    tiles: list[np.ndarray]
    grids: list[tuple[int, int]]  # (rows, cols) per image; (0, 0) = not split
    config: ImageProcessorConfig

    @property
    def pixel_values(self) -> np.ndarray:
        """float32 [num_images, max_tiles, 3, T, T], zero-padded: transformers' pixel_values for
        images=[[img0], [img1], ...] (one image per batch row). Computed on each access."""
        out = np.zeros((len(self.tiles), self._max_tiles(), 3, self._t(), self._t()), np.float32)
        for i, tiles in enumerate(self.tiles):
            out[i, : len(tiles)] = normalize_tiles(tiles, self.config)
        return out

    @property
    def pixel_attention_mask(self) -> np.ndarray:
        """int64 [num_images, max_tiles, T, T]: 1 on real tiles (every tile is a full T x T),
        0 on padding tiles, as transformers' pixel_attention_mask."""
        mask = np.zeros((len(self.tiles), self._max_tiles(), self._t(), self._t()), np.int64)
        for i, tiles in enumerate(self.tiles):
            mask[i, : len(tiles)] = 1
        return mask

    def _max_tiles(self) -> int:
        return max((len(t) for t in self.tiles), default=0)

    def _t(self) -> int:
        return self.config.tile_size


class ImageProcessor:
    """Idefics3ImageProcessorPil + Idefics3Processor's image text, configured by a checkpoint."""

    def __init__(self, config: ImageProcessorConfig | None = None) -> None:
        self.config = config or ImageProcessorConfig()

    def tile_grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) for an image of this size, from the size alone (e.g. a header), with the
        same arithmetic `process` follows."""
        c = self.config
        height, width = _resized_size(c, height, width)
        if not c.do_image_splitting:
            return 0, 0
        height, width = _tile_multiple_size(height, width, c.tile_size)
        if height > c.tile_size or width > c.tile_size:
            # transformers' (h - T) // T + 1; h is a multiple of T here.
            return (height - c.tile_size) // c.tile_size + 1, (width - c.tile_size) // c.tile_size + 1
        return 0, 0

    def process(self, images: Sequence[Image.Image]) -> ProcessedImages:
        tiles, grids = [], []
        for image in images:
            image_tiles, grid = self._process_one(image)
            tiles.append(image_tiles)
            grids.append(grid)
        return ProcessedImages(tiles=tiles, grids=grids, config=self.config)

    def prompt_for_image(self, rows: int, cols: int) -> str:
        return prompt_for_image(rows, cols, self.config.image_seq_len)

    def _process_one(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
        c, t = self.config, self.config.tile_size
        resample = Image.Resampling(c.resample)
        image = to_rgb(image)
        # Pillow returns a copy when the size is unchanged, as transformers' resize does.
        height, width = _resized_size(c, image.height, image.width)
        image = image.resize((width, height), resample=resample)
        if c.do_image_splitting:
            height, width = _tile_multiple_size(image.height, image.width, t)
            image = image.resize((width, height), resample=resample)
            # Both sides are now multiples of t, so "not over t" means exactly t x t: one view.
            if height > t or width > t:
                rows, cols = (height - t) // t + 1, (width - t) // t + 1  # transformers' formula
                hwc = np.asarray(image)[: rows * t, : cols * t]
                grid = hwc.reshape(rows, t, cols, t, 3).transpose(0, 2, 4, 1, 3).reshape(-1, 3, t, t)
                global_view = _chw(image.resize((t, t), resample=resample))
                return np.concatenate([grid, global_view[None]]), (rows, cols)
        else:
            image = image.resize((t, t), resample=resample)  # aspect ratio not kept
        return _chw(image)[None], (0, 0)


def _chw(image: Image.Image) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(image).transpose(2, 0, 1))


def normalize_tiles(tiles: np.ndarray, config: ImageProcessorConfig) -> np.ndarray:
    """uint8 [..., 3, H, W] -> float32 pixel values, bit-identical to transformers' rescale and
    normalize (services/common/pixel_normalization.py: what generation applies to shipped tiles)."""
    return normalization(config).apply(tiles)


def normalization(config: ImageProcessorConfig) -> PixelNormalization:
    return PixelNormalization(config.do_rescale, config.rescale_factor, config.do_normalize, config.image_mean,
                              config.image_std)


def prompt_for_image(
    rows: int,
    cols: int,
    image_seq_len: int,
    *,
    fake_token: str = FAKE_IMAGE_TOKEN,
    image_token: str = IMAGE_TOKEN,
    global_token: str = GLOBAL_IMAGE_TOKEN,
) -> str:
    """The text Idefics3Processor puts in place of one <image>: per grid row, each tile as
    <fake><row_r_col_c> + image_seq_len <image>, then "\\n"; then "\\n" and the global view
    <fake><global-img> + image_seq_len <image> + <fake>. An unsplit image (0, 0) is the global
    part alone. transformers tests `rows == 0 and cols == 0`, so (0, n) takes the split form."""
    run = image_token * image_seq_len
    global_part = f"{fake_token}{global_token}{run}{fake_token}"
    if rows == 0 and cols == 0:
        return global_part
    grid = "".join(
        "".join(f"{fake_token}<row_{r + 1}_col_{c + 1}>{run}" for c in range(cols)) + "\n"
        for r in range(rows)
    )
    return f"{grid}\n{global_part}"


def expand_prompt(text: str, grids: Sequence[tuple[int, int]], image_seq_len: int) -> str:
    """Replace the i-th <image> in `text` with image i's expansion, as Idefics3Processor does."""
    parts = text.split(IMAGE_TOKEN)
    if len(parts) - 1 != len(grids):
        raise ImageError(
            f"the prompt has {len(parts) - 1} {IMAGE_TOKEN} placeholders for {len(grids)} images"
        )
    out = [parts[0]]
    for (rows, cols), rest in zip(grids, parts[1:], strict=True):
        out += [prompt_for_image(rows, cols, image_seq_len), rest]
    return "".join(out)


def image_url_bytes(url: str, limits: ImageLimits = ImageLimits()) -> bytes:
    """The encoded image a chat part's URL carries: a `data:` URL's base64 payload. The server
    fetches nothing (no host is allow-listed): an http(s) URL is refused, naming the fix."""
    if url.startswith(("http://", "https://")):
        raise ImageError("this server fetches no image URLs (no host is allow-listed): send the image "
                         "inline as a data: URL (data:image/png;base64,...)")
    head, comma, payload = url.partition(",")
    if not head.startswith("data:") or not comma or not head.endswith(";base64"):
        raise ImageError("an image URL must be a base64 data: URL (data:image/png;base64,...)")
    if len(payload) > 4 * (limits.max_bytes // 3) + 4:
        raise ImageError(f"the image is larger than {limits.max_bytes} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the data: URL's payload is not valid base64") from None
