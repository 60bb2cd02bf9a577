"""Images in the engine on CPU: the vision encoder's cost, an image request's first token, and what
it does to the inter-token latency of text streams decoding beside it (engine alone).

    .venv/bin/python -m bench.images [--threads 2] [--no-write]

The model is SmolVLM-256M's shape: the default model's real SmolLM2-135M decoder (its GGUF, the
fused CPU step) and a random-init vision tower of SmolVLM's real size (SigLIP base: 12 layers, 768
wide, 512-pixel tiles, 16-pixel patches, pixel shuffle 4 -> 64 tokens a tile; no index ships the
weights, and the encoder's cost does not depend on their values). Rows:
- the encoder alone: seconds per tile at batches of 1 and 4;
- an image request alone: time to first token for 1 tile and 5 tiles (a 2 x 2 grid + global view);
- beside 4 text streams: their median and worst step time (ITL) while a 5-tile request encodes,
  with the per-step bound (one new image a step while others run: scheduler.py) and without it
  (every image at once), side by side in one run.
Writes docs/benchmarks.md's `images` section.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from bench import doc_sections
from bench.engine import machine
from services.common.pixel_normalization import PixelNormalization
from services.generation import image_inputs, scheduler
from services.generation.engine import Engine, EngineConfig
from services.generation.image_inputs import ImageInput
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.models.vision import VisionConfig, vision_weight_names
from services.generation.sampling_params import SamplingParams
from services.generation.speculation import SpeculationConfig
from services.generation.weights.checkpoint import VisionWeights
from services.generation.weights.locate import load_checkpoint

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SIGLIP = VisionConfig(hidden_size=768, intermediate_size=3072, num_layers=12, num_heads=12, image_size=512,
                      patch_size=16, scale_factor=4, text_hidden_size=576)
IMAGE_TOKEN = 49151  # a token id standing in for <image> (the text model's vocabulary has none)


def _shape(name: str, c: VisionConfig) -> tuple[int, ...]:
    d, f = c.hidden_size, c.intermediate_size
    if name.endswith("patch_embedding.weight"):
        return (d, 3, c.patch_size, c.patch_size)
    if name.endswith("position_embedding.weight"):
        return (c.patches_per_tile, d)
    if name.endswith("proj.weight") and "connector" in name:
        return (c.text_hidden_size, d * c.scale_factor ** 2)
    if name.endswith("fc1.weight"):
        return (f, d)
    if name.endswith("fc1.bias"):
        return (f,)
    if name.endswith("fc2.weight"):
        return (d, f)
    if name.endswith(".weight") and "_proj" in name:
        return (d, d)
    return (d,)  # biases and norms


def vlm_runner(threads: int) -> ModelRunner:
    checkpoint = load_checkpoint("default")
    g = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(_shape(n, SIGLIP), generator=g) * 0.02 for n in vision_weight_names(SIGLIP)}
    checkpoint.vision = VisionWeights(SIGLIP, tensors, IMAGE_TOKEN, PixelNormalization())
    runner = ModelRunner(checkpoint, RunnerConfig(num_blocks=1024, block_size=16, device="cpu", num_threads=threads))
    runner.warm_up()
    return runner


def tiles(n: int, seed: int) -> list[ImageInput]:
    rng = np.random.default_rng(seed)
    return [ImageInput(rng.integers(0, 256, (1, 3, 512, 512), dtype=np.uint8).tobytes(), 1) for _ in range(n)]


def image_prompt(n_tiles: int) -> list[int]:
    return [1, 4093, 28] + ([49152 - 2] + [IMAGE_TOKEN] * 64) * n_tiles + [49152 - 2, 15734, 2]


def engine(runner) -> Engine:
    return Engine(runner, EngineConfig(num_blocks=1024, block_size=16, max_num_seqs=16, max_num_batched_tokens=512,
                                       speculation=SpeculationConfig("off")), on_step=lambda out: None)


def encoder_seconds(runner, batch: int) -> float:
    x = torch.randn(batch, 3, 512, 512)
    runner.vision(x[:1])  # warm
    t = time.perf_counter()
    runner.vision(x)
    return (time.perf_counter() - t) / batch


def ttft_alone(runner, n_tiles: int, seed: int) -> float:
    e = engine(runner)
    e.add_request("img", image_prompt(n_tiles), SamplingParams(temperature=0.0, max_tokens=1), images=tiles(n_tiles, seed))
    t = time.perf_counter()
    while e.seqs or not e._commands.empty():
        e.run_once()
    return time.perf_counter() - t


def beside_streams(runner, n_tiles: int, seed: int, most_new: int) -> dict:
    image_inputs.MAX_NEW_IMAGES_PER_STEP = scheduler.MAX_NEW_IMAGES_PER_STEP = most_new
    e = engine(runner)
    for i in range(4):
        e.add_request(f"t{i}", [1, 504 + i, 314], SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True))
    for _ in range(4):
        e.run_once()
    before = []
    for _ in range(8):
        t = time.perf_counter()
        e.run_once()
        before.append(time.perf_counter() - t)
    steps, first = [], None
    e.add_request("img", image_prompt(n_tiles), SamplingParams(temperature=0.0, max_tokens=1), images=tiles(n_tiles, seed))
    start = time.perf_counter()
    while "img" in {k for k in e.seqs} or not e._commands.empty():
        t = time.perf_counter()
        out = e.run_once()
        steps.append(time.perf_counter() - t)
        if first is None and any(tok.key == "img" for tok in out.tokens):
            first = time.perf_counter() - start
    for key in list(e.seqs):
        e.abort(key)
    e.run_once()
    return {"text_alone_itl": statistics.median(before), "median_itl": statistics.median(steps), "max_itl": max(steps),
            "ttft": first or time.perf_counter() - start, "steps": len(steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    runner = vlm_runner(args.threads)
    enc1, enc4 = encoder_seconds(runner, 1), encoder_seconds(runner, 4)
    print(f"encoder: {enc1:.3f} s/tile at 1, {enc4:.3f} s/tile at 4", flush=True)
    alone = {n: ttft_alone(runner, n, seed=n) for n in (1, 5)}
    print("ttft alone", alone, flush=True)
    bounded = beside_streams(runner, 5, 100, 1)
    unbounded = beside_streams(runner, 5, 200, 1000)
    print("bounded", bounded, "unbounded", unbounded, flush=True)
    body = "\n".join([
        f"Measured on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine(torch.device('cpu'))}, "
        f"{args.threads} threads. SmolVLM-256M's shape: SmolLM2-135M's real decoder (the default GGUF, fused step) "
        "and a random-init SigLIP-base vision tower (12 x 768, 512-pixel tiles, 64 tokens a tile), fp32. "
        "`python -m bench.images`.", "",
        "| what | value |", "|---|---:|",
        f"| encoder, one tile alone | {enc1:.2f} s |",
        f"| encoder, per tile in a batch of 4 | {enc4:.2f} s |",
        f"| first token of a 1-tile image request, alone | {alone[1]:.2f} s |",
        f"| first token of a 5-tile image request, alone | {alone[5]:.2f} s |", "",
        "Four text streams decoding while a 5-tile image request (one image part per tile, as the internal "
        "stream sends them) prefills, one run, the two policies taking turns:", "",
        "| policy | text streams' step before | median step while it prefills | worst step | "
        "image request's first token |", "|---|---:|---:|---:|---:|",
        *(f"| {name} | {r['text_alone_itl'] * 1e3:.0f} ms | {r['median_itl'] * 1e3:.0f} ms | {r['max_itl'] * 1e3:.0f} ms | "
          f"{r['ttft']:.2f} s |" for name, r in (("one new image a step (default)", bounded),
                                                 ("every image at once", unbounded))),
    ])
    print(body)
    if not args.no_write:
        doc_sections.write(DOC, "images", body)


if __name__ == "__main__":
    main()
