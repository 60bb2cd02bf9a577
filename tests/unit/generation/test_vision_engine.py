"""Images through the engine (image_inputs.py, models/vision.py, model_runner.image_embeds): an
Idefics3 checkpoint directory saved by transformers (a small random-init vision tower of the real
geometry, a tiny Llama decoder) serves prompts with image tokens, and greedy continuations equal
transformers' Idefics3ForConditionalGeneration.generate; the prefix cache shares KV between two
requests with the same image and never between two with different images; a prompt whose image
tokens do not match its images, and images sent to a text-only model, are refused naming the
field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from generation_helpers import drive, make_engine

from services.common.errors import Code
from services.common.pixel_normalization import PixelNormalization
from services.generation.image_inputs import ImageInput
from services.generation.sampling_params import SamplingParams
from services.generation.weights.safetensors import load_hf_dir

IMAGE, FAKE = 100, 101
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=512,
              patch_size=16)
TEXT = dict(model_type="llama", hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=128, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    import transformers

    config = transformers.Idefics3Config(vision_config=VISION, text_config=TEXT, scale_factor=4, image_token_id=IMAGE)
    torch.manual_seed(0)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)  # far from init, so images change the continuation
    directory = str(tmp_path_factory.mktemp("idefics3"))
    model.save_pretrained(directory)
    return model, load_hf_dir(directory)


def image(seed: int, tiles: int) -> ImageInput:
    pixels = np.random.default_rng(seed).integers(0, 256, (tiles, 3, 512, 512), dtype=np.uint8)
    return ImageInput(pixels.tobytes(), tiles)


def pixel_values(images: list[ImageInput]) -> torch.Tensor:
    """What transformers' processor gives for the images' tiles (bit-identical: test_images.py)."""
    tiles = np.frombuffer(b"".join(im.tiles for im in images), np.uint8).reshape(-1, 3, 512, 512)
    return torch.from_numpy(PixelNormalization().apply(tiles))


def prompt(*tiles_per_image: int, text=(5, 6, 7)) -> list[int]:
    ids = list(text)
    for n in tiles_per_image:
        for _ in range(n):
            ids += [FAKE] + [IMAGE] * 64
        ids += [FAKE, 9]
    return ids + [10, 11]


def hf_greedy(model, ids: list[int], images: list[ImageInput], n: int) -> list[int]:
    pixels = pixel_values(images)[None]
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), pixel_values=pixels, max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def engine_for(checkpoint, max_num_batched_tokens=128, **kw):
    return make_engine(checkpoint, num_blocks=256, block_size=16, max_num_batched_tokens=max_num_batched_tokens,
                       dtype="float32", quantization="none", **kw)


GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.mark.parametrize("tiles", [(1,), (3,), (2, 1)], ids=["one-tile", "tiled", "two-images"])
def test_greedy_continuations_are_transformers(vlm, tiles):
    model, checkpoint = vlm
    ids = prompt(*tiles)
    images = [image(i, n) for i, n in enumerate(tiles)]
    engine = engine_for(checkpoint)  # 128-token steps: the image tokens span several prefill chunks
    engine.add_request("r", ids, GREEDY, images=images)
    tokens, completed, failed, _ = drive(engine)
    assert not failed
    assert tokens["r"] == hf_greedy(model, ids, images, 6)


def test_the_prefix_cache_shares_an_image_and_never_mixes_two(vlm):
    _, checkpoint = vlm
    ids = prompt(1)
    a = image(1, 1)
    b = ImageInput(np.full((1, 3, 512, 512), 255, np.uint8).tobytes(), 1)  # white: another continuation
    results = {}
    engine = engine_for(checkpoint)
    for key, im in (("a", a), ("a-again", a), ("b", b)):
        engine.add_request(key, ids, GREEDY, images=[im])
        hits = engine.block_manager.num_prefix_hit_tokens
        tokens, _, failed, _ = drive(engine)
        assert not failed
        results[key] = (tokens[key], engine.block_manager.num_prefix_hit_tokens - hits)
    fresh = engine_for(checkpoint)
    fresh.add_request("b", ids, GREEDY, images=[b])
    alone = drive(fresh)[0]["b"]
    assert results["a-again"][0] == results["a"][0] and results["a-again"][1] >= 64  # image blocks reused
    assert results["b"][0] == alone and results["b"][1] < 16  # only the text before the image
    assert results["a"][0] != results["b"][0]
    assert engine.runner.num_images_encoded == 2  # a once (the encoder cache), b once
    assert engine.stats.snapshot()["images_encoded"] == 2 and engine.stats.snapshot()["encoder_cache_images"] == 2


def test_image_tokens_must_match_the_images_and_a_text_model_takes_none(vlm, tiny_checkpoint):
    _, checkpoint = vlm
    engine = engine_for(checkpoint)
    engine.add_request("short", prompt(1), GREEDY, images=[image(0, 2)])
    engine.add_request("open", prompt(1), GREEDY, input_done=False, images=[image(0, 1)])
    text_only = make_engine(tiny_checkpoint)
    text_only.add_request("text", [1, 2, 3], GREEDY, images=[image(0, 1)])
    failures = {**drive(engine)[2], **drive(text_only)[2]}
    for key, words in (("short", "64 image tokens"), ("open", "complete"), ("text", "text only")):
        error = failures[key].error
        assert error.code is Code.INVALID_ARGUMENT and error.field_violations[0].field == "images", error
        assert words in error.message


def test_with_smollm2s_real_text_weights_greedy_is_transformers(tmp_path_factory):
    """SmolVLM-256M's shape of checkpoint: SmolLM2-135M's real decoder (the embedded GGUF's weights,
    dequantized), its vocabulary grown to SmolVLM's 49,280 for the image tokens (random rows, as the
    added tokens of an untrained checkpoint), and the small random vision tower."""
    import transformers

    from services.generation.weights.locate import load_checkpoint

    text = load_checkpoint("default")
    hf_text = text.config.hf_config().to_dict() | {"vocab_size": 49280}
    config = transformers.Idefics3Config(vision_config=VISION, text_config=hf_text, scale_factor=4,
                                         image_token_id=49190, tie_word_embeddings=True)
    torch.manual_seed(1)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    weights = {"model.text_model." + n[len("model."):]: t for n, t in text.state_dict.items() if n.startswith("model.")}
    with torch.no_grad():
        embed = model.model.text_model.embed_tokens.weight
        embed[:49152].copy_(weights.pop("model.text_model.embed_tokens.weight"))  # rows past it: random
        missing, _ = model.load_state_dict(weights, strict=False)
    assert not [n for n in missing if "text_model" in n and "embed_tokens" not in n]
    directory = str(tmp_path_factory.mktemp("smolvlm-shaped"))
    model.save_pretrained(directory)
    checkpoint = load_hf_dir(directory)
    ids = [1, 4093, 28, 8041, 314] + ([49189] + [49190] * 64) * 2 + [49189, 15734, 281, 2]
    images = [image(7, 2)]
    engine = make_engine(checkpoint, num_blocks=64, block_size=16, max_num_batched_tokens=256, dtype="float32",
                         quantization="none")
    engine.add_request("r", ids, GREEDY, images=images)
    tokens, _, failed, _ = drive(engine)
    assert not failed
    assert tokens["r"] == hf_greedy(model, ids, images, 6)


def test_an_image_through_the_preprocess_processor_continues_as_transformers(vlm):
    """A non-square picture: tiled and normalized by services/preprocess/images.py (uint8 tiles,
    normalized on arrival), against transformers' own image processor feeding generate."""
    import transformers
    from PIL import Image

    from services.preprocess.images import ImageProcessor, ImageProcessorConfig, normalize_tiles

    model, checkpoint = vlm
    picture = Image.fromarray(np.random.default_rng(3).integers(0, 256, (300, 700, 3), dtype=np.uint8))
    settings = {"size": {"longest_edge": 1024}, "max_image_size": {"longest_edge": 512}}
    config = ImageProcessorConfig.from_dict(settings)
    processed = ImageProcessor(config).process([picture])
    rows, cols = processed.grids[0]
    assert (rows, cols) == (1, 2)
    tiles = torch.from_numpy(normalize_tiles(processed.tiles[0], config))
    ours = ImageInput(processed.tiles[0].tobytes(), len(processed.tiles[0]))
    hf_pixels = transformers.Idefics3ImageProcessorPil(**settings)(picture, return_tensors="pt")["pixel_values"]
    assert torch.equal(hf_pixels[0], tiles)
    ids = prompt(rows * cols + 1)
    engine = engine_for(checkpoint)
    engine.add_request("r", ids, GREEDY, images=[ours])
    tokens, _, failed, _ = drive(engine)
    assert not failed and tokens["r"] == hf_greedy(model, ids, [ours], 6)


def test_an_image_request_encodes_one_image_a_step_beside_other_streams(vlm):
    """Three images of one tile each (the internal stream's form) next to a decoding text stream:
    the text stream gets a token every step and each step encodes at most one new image; the image
    request's tokens stay transformers'. Alone, it encodes all three in its first step."""
    model, checkpoint = vlm
    ids = prompt(1, 1, 1)
    images = [image(10 + i, 1) for i in range(3)]
    engine = engine_for(checkpoint, max_num_batched_tokens=512)
    engine.add_request("text", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    engine.run_once()  # the text stream is decoding
    engine.add_request("img", ids, GREEDY, images=images)
    encoded, text_tokens = [], []
    tokens: dict = {}
    while engine.seqs:
        before = engine.runner.num_images_encoded
        out = engine.run_once()
        encoded.append(engine.runner.num_images_encoded - before)
        text_tokens.append(sum(t.key == "text" for t in out.tokens))
        for t in out.tokens:
            tokens.setdefault(t.key, []).append(t.token_id)
    assert max(encoded) == 1 and sum(encoded) == 3
    assert all(text_tokens[:5])  # the text stream decoded on every step while the images encoded
    assert tokens["img"] == hf_greedy(model, ids, images, 6)
    alone = engine_for(checkpoint, max_num_batched_tokens=512)
    alone.add_request("img", ids, GREEDY, images=[image(20 + i, 1) for i in range(3)])
    alone.run_once()
    alone.run_once()
    assert alone.runner.num_images_encoded == 3
