"""services/preprocess/images.py against transformers' Idefics3ImageProcessorPil and
Idefics3Processor (the oracle), with SmolVLM-256M-Instruct's configuration.

Pixel values are compared with np.array_equal, not a tolerance: transformers rescales in float64
and casts to float32 before a float32 normalize, and images.py's lookup table is built with those
same operations, so there is no rounding difference to tolerate.
"""

from __future__ import annotations

import base64
import inspect
import io
import json
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from services.preprocess.images import (
    ImageError,
    ImageLimits,
    ImageProcessor,
    ImageProcessorConfig,
    decode_image,
    expand_prompt,
    normalize_tiles,
    prompt_for_image,
)

transformers = pytest.importorskip("transformers")

# SmolVLM-256M-Instruct's preprocessor_config.json and processor_config.json.
SMOLVLM_PREPROCESSOR = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Idefics3ImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 512},
    "processor_class": "Idefics3Processor",
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 2048},
}
SMOLVLM_PROCESSOR = {"image_seq_len": 64, "processor_class": "Idefics3Processor"}
HF_CONFIG_KEYS = {k: v for k, v in SMOLVLM_PREPROCESSOR.items() if not k.endswith(("_type", "_class"))}
rng = np.random.default_rng(20240611)


def noise(width: int, height: int, mode: str = "RGB") -> Image.Image:
    channels = len(Image.new(mode, (1, 1)).getbands())
    shape = (height, width) if channels == 1 else (height, width, channels)
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)


def gradient(width: int, height: int) -> Image.Image:
    x = np.linspace(0, 255, width)[None, :]
    y = np.linspace(0, 255, height)[:, None]
    rgb = np.stack([x + 0 * y, y + 0 * x, (x + y) / 2], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def png(image: Image.Image, **params) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", **params)
    return buf.getvalue()


def hf_image_processor(**overrides):
    return transformers.Idefics3ImageProcessorPil(**{**HF_CONFIG_KEYS, **overrides})


def ours(**overrides) -> ImageProcessor:
    return ImageProcessor(
        ImageProcessorConfig.from_dict({**SMOLVLM_PREPROCESSOR, **overrides}, SMOLVLM_PROCESSOR)
    )


def assert_parity(images: list[Image.Image], **overrides) -> None:
    """Ours == transformers with one image per batch row (our layout), to the bit."""
    processor = ours(**overrides)
    got = processor.process(images)
    want = hf_image_processor(**overrides)([[im] for im in images], return_row_col_info=True)
    assert got.pixel_values.dtype == np.float32 and got.pixel_attention_mask.dtype == np.int64
    assert got.pixel_values.shape == want["pixel_values"].shape
    assert np.array_equal(got.pixel_values, want["pixel_values"])
    assert np.array_equal(got.pixel_attention_mask, want["pixel_attention_mask"])
    assert got.grids == [(r[0], c[0]) for r, c in zip(want["rows"], want["cols"], strict=True)]
    assert got.grids == [processor.tile_grid(*im.size) for im in images]
    for i, tiles in enumerate(got.tiles):
        # The uint8 tiles (what is shipped) normalize to exactly transformers' pixel values.
        t = processor.config.tile_size
        assert tiles.dtype == np.uint8 and tiles.shape[1:] == (3, t, t)
        assert np.array_equal(normalize_tiles(tiles, processor.config), want["pixel_values"][i, : len(tiles)])


def palette_with_transparency() -> Image.Image:
    image = noise(300, 200).quantize(colors=16)
    image.info["transparency"] = 3  # palette index 3 is transparent: composited onto white
    return decode_image(png(image))


def rgba() -> Image.Image:
    image = noise(640, 480, "RGBA")
    return decode_image(png(image))


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: noise(32, 32), id="32x32-upscaled-and-split"),
        pytest.param(lambda: gradient(512, 512), id="512x512"),
        pytest.param(lambda: noise(700, 300), id="700x300"),
        pytest.param(lambda: gradient(300, 700), id="300x700"),
        pytest.param(lambda: noise(1536, 1000), id="1536x1000"),
        pytest.param(lambda: gradient(2048, 2048), id="2048x2048"),
        pytest.param(lambda: noise(333, 517, "L"), id="grayscale-L"),
        pytest.param(rgba, id="rgba-png"),
        pytest.param(palette_with_transparency, id="palette-transparency"),
        pytest.param(lambda: decode_image(png(gradient(401, 999).quantize(colors=64))), id="palette"),
    ],
)
def test_one_image_matches_transformers_exactly(make) -> None:
    assert_parity([make()])


def test_several_images_pad_to_the_most_tiles() -> None:
    images = [noise(700, 300), gradient(1536, 1000), noise(32, 32, "L")]  # 9, 13 and 17 tiles
    assert_parity(images)
    got = ours().process(images)
    assert got.pixel_values.shape == (3, 17, 3, 512, 512)
    assert got.pixel_attention_mask[0, 9:].sum() == 0 and got.pixel_attention_mask[0, :9].all()
    # Idefics3Processor batches one prompt's images as one row ([1, 39, ...]); the model drops
    # all-zero padding tiles, so the real tiles in order are what must agree.
    one_row = hf_image_processor()([images])["pixel_values"]
    ours_real = np.concatenate([normalize_tiles(t, got.config) for t in got.tiles])
    assert np.array_equal(ours_real, one_row[0])


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"do_image_splitting": False}, id="no-splitting"),
        pytest.param({"size": {"longest_edge": 512}}, id="splitting-but-one-tile"),
        pytest.param(
            {"size": {"longest_edge": 1000}, "max_image_size": {"longest_edge": 384}}, id="other-sizes"
        ),
    ],
)
def test_unsplit_and_other_configs_match_transformers(overrides) -> None:
    images = [noise(700, 300), gradient(32, 48), noise(90, 1200, "L")]
    assert_parity(images, **overrides)
    if "do_image_splitting" in overrides or overrides["size"]["longest_edge"] == 512:
        assert ours(**overrides).process(images).grids == [(0, 0)] * 3


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(width=st.integers(1, 2500), height=st.integers(1, 2500))
def test_random_sizes_match_transformers(width: int, height: int) -> None:
    assert_parity([noise(width, height)])


@pytest.fixture(scope="module")
def smolvlm_pair():
    return hf_image_processor(), ours()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(width=st.integers(1, 5000), height=st.integers(1, 5000))
def test_tile_grid_matches_transformers_patch_count(smolvlm_pair, width: int, height: int) -> None:
    # tile_grid (the token count from a header's size) vs the helper vLLM uses for the same.
    hf, processor = smolvlm_pair
    _, rows, cols = hf.get_number_of_image_patches(height, width)
    assert processor.tile_grid(width, height) == (rows, cols)


def test_tile_grid_follows_preprocess_where_transformers_patch_count_does_not() -> None:
    # get_number_of_image_patches rounds the short side up from its pre-resize length, while
    # preprocess re-derives it from the aspect ratio first. With size 2048 (a multiple of 512)
    # they agree; with size 1000 a 39x77 image is counted 2x1 but preprocessed as 2x2.
    overrides = {"size": {"longest_edge": 1000}}
    hf = hf_image_processor(**overrides)
    assert hf.get_number_of_image_patches(77, 39)[1:] == (2, 1)
    done = hf([[noise(39, 77)]], return_row_col_info=True)
    assert (done["rows"], done["cols"]) == ([[2]], [[2]])
    assert ours(**overrides).tile_grid(39, 77) == (2, 2)


# --- the prompt text ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_processor_factory():
    tokenizers = pytest.importorskip("tokenizers")

    def make(**overrides):
        # A word-level tokenizer with nothing but the special tokens: enough for the processor,
        # which only needs their ids and char offsets.
        model = tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")
        raw = tokenizers.Tokenizer(model)
        raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
        grid = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
        tokenizer.add_special_tokens(
            {"additional_special_tokens": ["<fake_token_around_image>", "<image>", "<global-img>", *grid]}
        )
        return transformers.Idefics3Processor(
            image_processor=hf_image_processor(**overrides), tokenizer=tokenizer, image_seq_len=64
        )

    return make


def hf_expanded_text(processor, images, text: str) -> str:
    """The prompt exactly as Idefics3Processor hands it to the tokenizer."""
    seen = []
    original = processor.get_text_with_replacements

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        seen.append(list(result[0]))
        return result

    processor.get_text_with_replacements = spy
    processor(images=images, text=text)
    (texts,) = seen
    return texts[0]


@pytest.mark.parametrize(
    ("sizes", "text", "overrides"),
    [
        pytest.param([(700, 300)], "<image>What is in this picture?", {}, id="one-image"),
        pytest.param([(1536, 1000), (32, 32)], "User:<image>and<image>\nAssistant:", {}, id="two-images"),
        pytest.param([(700, 300), (30, 60)], "A<image>B<image>", {"do_image_splitting": False}, id="unsplit"),
    ],
)
def test_prompt_matches_idefics3_processor(hf_processor_factory, sizes, text, overrides) -> None:
    images = [noise(w, h) for w, h in sizes]
    processor = ours(**overrides)
    got = expand_prompt(text, processor.process(images).grids, processor.config.image_seq_len)
    assert got == hf_expanded_text(hf_processor_factory(**overrides), images, text)


def test_prompt_for_image_matches_replace_image_token(hf_processor_factory) -> None:
    hf = hf_processor_factory()
    for rows, cols in [(0, 0), (1, 1), (2, 4), (4, 4), (3, 2), (0, 3)]:
        want = hf.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, image_idx=0)
        assert prompt_for_image(rows, cols, 64) == want
    assert prompt_for_image(1, 2, 2) == (
        "<fake_token_around_image><row_1_col_1><image><image>"
        "<fake_token_around_image><row_1_col_2><image><image>\n"
        "\n<fake_token_around_image><global-img><image><image><fake_token_around_image>"
    )
    with pytest.raises(ImageError, match="2 <image> placeholders for 1 images"):
        expand_prompt("<image><image>", [(0, 0)], 64)


def test_the_module_does_not_import_torch() -> None:
    code = "import sys, services.preprocess.images; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- configuration --------------------------------------------------------------------------


def test_defaults_are_smolvlm_256m_and_agree_with_transformers_class_defaults(tmp_path) -> None:
    default = ImageProcessorConfig()
    assert ImageProcessorConfig.from_dict(SMOLVLM_PREPROCESSOR, SMOLVLM_PROCESSOR) == default
    # Everything but the sizes is the Idefics3 class default too; the sizes (4*364, 364) and
    # image_seq_len (169) are Idefics3's, which SmolVLM's checkpoint overrides.
    cls = transformers.Idefics3ImageProcessorPil()
    assert int(cls.resample) == default.resample == 1
    assert tuple(cls.image_mean) == default.image_mean and tuple(cls.image_std) == default.image_std
    assert cls.rescale_factor == default.rescale_factor
    assert (cls.do_resize, cls.do_rescale, cls.do_normalize, cls.do_image_splitting) == (True,) * 4
    assert cls.size.longest_edge == 4 * 364 and cls.max_image_size == {"longest_edge": 364}
    image_seq_len = inspect.signature(transformers.Idefics3Processor.__init__).parameters["image_seq_len"]
    assert image_seq_len.default == 169
    configured = hf_image_processor().to_dict()
    assert configured["size"] == {"longest_edge": 2048} and configured["max_image_size"] == {
        "longest_edge": 512
    }

    # A checkpoint directory; the newer layout nests the image processor in processor_config.json.
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"image_seq_len": 81, "image_processor": {"max_image_size": {"longest_edge": 384}}})
    )
    loaded = ImageProcessorConfig.from_dir(tmp_path)
    assert (loaded.image_seq_len, loaded.tile_size, loaded.size) == (81, 384, (("longest_edge", 2048),))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"resample": 9}, "resample"),
        ({"size": {"shortest_edge": 10}}, "size must have"),
        ({"max_image_size": {"height": 3}}, "max_image_size"),
        ({"image_std": [0.5, 0, 0.5]}, "image_std"),
        ({"image_mean": [0.5, 0.5]}, "image_mean"),
        ({"do_convert_rgb": False}, "do_convert_rgb"),
    ],
)
def test_bad_config_is_refused(bad, message) -> None:
    with pytest.raises(ValueError, match=message):
        ImageProcessorConfig.from_dict({**SMOLVLM_PREPROCESSOR, **bad})


# --- decoding hostile input -----------------------------------------------------------------


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height, with one tiny IDAT: decoding would need
    width*height*3 bytes, so it must be refused from the header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


@pytest.fixture
def no_decoding(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)


def test_a_huge_header_is_refused_before_decoding(no_decoding, monkeypatch) -> None:
    data = png_header_only(100_000, 100_000)
    with pytest.raises(ImageError, match="pixel limit"):
        decode_image(data)  # Pillow's own global cap (2 x 89M) fires inside open()
    # Without Pillow's process-wide cap, the per-call limit alone refuses it.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    with pytest.raises(ImageError, match=r"100000x100000 = 10000000000 pixels, over the limit of 33177600"):
        decode_image(data)
    with pytest.raises(ImageError, match=r"64x64 = 4096 pixels, over the limit of 4000"):
        decode_image(png(noise(64, 64)), ImageLimits(max_pixels=4000))


def test_an_oversized_payload_is_refused_before_opening(monkeypatch) -> None:
    monkeypatch.setattr(Image, "open", lambda *a, **k: pytest.fail("opened"))
    with pytest.raises(ImageError, match="2000 bytes, over the limit of 1000 bytes"):
        decode_image(b"\0" * 2000, ImageLimits(max_bytes=1000))


def test_corrupt_and_non_image_bytes_are_refused() -> None:
    good = png(noise(64, 64))
    with pytest.raises(ImageError, match="not an image in an accepted format"):
        decode_image(b"definitely not an image")
    with pytest.raises(ImageError, match="image is empty"):
        decode_image(b"")
    with pytest.raises(ImageError, match="corrupt or truncated PNG"):
        decode_image(good[: len(good) // 2])
    with pytest.raises(ImageError, match="corrupt or truncated PNG"):
        decode_image(png_header_only(64, 64))  # IDAT far too short for its header
    tiff = io.BytesIO()
    noise(8, 8).save(tiff, format="TIFF")
    with pytest.raises(ImageError, match="accepted format"):
        decode_image(tiff.getvalue())  # a real image, but not a format we open
    assert decode_image(tiff.getvalue(), ImageLimits(formats=("TIFF",))).size == (8, 8)


def hf_load(data: bytes) -> Image.Image:
    return transformers.image_utils.load_image(base64.b64encode(data).decode())


def test_an_animated_gif_is_its_first_frame_like_load_image() -> None:
    frames = [gradient(120, 80), noise(120, 80)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    data = buf.getvalue()
    decoded = decode_image(data)
    assert getattr(decoded, "n_frames", 1) == 1
    first = Image.open(io.BytesIO(data)).convert("RGB")
    assert np.array_equal(np.asarray(decoded.convert("RGB")), np.asarray(first))
    got = ours().process([decoded]).pixel_values
    assert np.array_equal(got, hf_image_processor()([[hf_load(data)]])["pixel_values"])


def test_exif_orientation_is_applied_like_load_image() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    gradient(300, 200).save(buf, format="JPEG", exif=exif)
    decoded = decode_image(buf.getvalue())
    assert decoded.size == (200, 300)
    got = ours().process([decoded]).pixel_values
    assert np.array_equal(got, hf_image_processor()([[hf_load(buf.getvalue())]])["pixel_values"])


def test_transparency_is_composited_onto_white_unlike_load_image() -> None:
    # Fully transparent red: the image processor (and we) see white; load_image's
    # convert("RGB") would keep the hidden red. We follow the image processor.
    image = Image.new("RGBA", (64, 64), (255, 0, 0, 0))
    decoded = decode_image(png(image))
    tiles = ours().process([decoded]).tiles[0]
    assert (tiles == 255).all()
    assert np.asarray(hf_load(png(image)))[0, 0].tolist() == [255, 0, 0]
