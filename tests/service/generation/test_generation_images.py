"""The real generation server on an Idefics3 checkpoint directory (a small random-init vision tower
of the real geometry, a tiny Llama decoder): a PreprocessInput carrying its prompt's token ids and
one MODALITY_IMAGE part per uint8 tile (the internal stream's image form, wire.TILE_MIME_TYPE)
continues exactly as transformers' generate; malformed tiles, images in an append, and images for
a text-only model each fail their request alone with INVALID_ARGUMENT naming the part."""

import numpy as np
import pytest
import torch
from generation_server_proc import start_server, stop_server
from generation_stream_client import StreamClient, append, start
from mstar.v1 import messages_pb2 as pb

from services.common.pixel_normalization import PixelNormalization

TILE = "application/x-mstar-image-tile"
IMAGE, FAKE = 100, 101


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    import transformers

    config = transformers.Idefics3Config(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=512, patch_size=16),
        text_config=dict(model_type="llama", hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=128, max_position_embeddings=512),
        scale_factor=4, image_token_id=IMAGE)
    torch.manual_seed(0)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    directory = str(tmp_path_factory.mktemp("idefics3"))
    model.save_pretrained(directory)
    return model, directory


def with_tiles(frame, tiles: np.ndarray, mime=TILE):
    frame.preprocess_input.prompt_parts.extend(
        pb.PromptPart(modality=pb.MODALITY_IMAGE, data=t.tobytes(), mime_type=mime) for t in tiles)
    return frame


def test_image_tiles_on_the_stream_continue_as_transformers(vlm, tiny_model_dir):
    model, directory = vlm
    tiles = np.random.default_rng(0).integers(0, 256, (2, 3, 512, 512), dtype=np.uint8)
    ids = [5, 6] + ([FAKE] + [IMAGE] * 64) * 2 + [FAKE, 7, 8]
    with torch.no_grad():
        pixels = torch.from_numpy(PixelNormalization().apply(tiles))[None]
        want = model.generate(input_ids=torch.tensor([ids]), pixel_values=pixels, max_new_tokens=5,
                              do_sample=False)[0, len(ids):].tolist()
    proc, port = start_server(directory, "--kv-blocks", "64", "--block-size", "16", "--dtype", "float32",
                              "--quantization", "none")
    try:
        client = StreamClient(port)
        client.send(with_tiles(start("img", ids, max_tokens=5, ignore_eos=True), tiles),
                    with_tiles(start("short", ids, max_tokens=5), tiles[:1]),  # 128 image tokens, 1 tile
                    with_tiles(start("bytes", ids, max_tokens=5), tiles[:, :, :256]),
                    with_tiles(start("mime", ids, max_tokens=5), tiles, mime="image/png"),
                    start("open", [5, 6, 7], max_tokens=5, input_open=True))
        client.send(with_append_tile(append("open", [8]), tiles[0]))
        assert client.wait_ended(["img", "short", "bytes", "mime", "open"])
        assert client.ends["img"].HasField("request_complete") and client.tokens["img"] == want
        for rid, field, words in (("short", "images", "128 image tokens"), ("bytes", "prompt_parts[1]", "bytes"),
                                  ("mime", "prompt_parts[1]", "tile"), ("open", "chunks[1]", "start")):
            failed = client.ends[rid].request_failed
            assert failed.code == 3, (rid, failed)  # INVALID_ARGUMENT
            assert field in failed.message and words in failed.message, (rid, failed.message)
        client.close()
    finally:
        stop_server(proc)
    proc, port = start_server(tiny_model_dir, "--kv-blocks", "64", "--block-size", "4")
    try:
        client = StreamClient(port)
        client.send(with_tiles(start("text-only", [5, 6, 7], max_tokens=3), tiles[:1]))
        assert client.wait_ended(["text-only"])
        status = client.ends["text-only"].request_failed
        assert status.code == 3 and "prompt_parts[1]" in status.message and "text only" in status.message
        client.close()
    finally:
        stop_server(proc)


def with_append_tile(frame, tile: np.ndarray):
    frame.client_append.chunks.append(pb.PromptPart(modality=pb.MODALITY_IMAGE, data=tile.tobytes(), mime_type=TILE))
    return frame
