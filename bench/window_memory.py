"""Resident KV memory of one Gemma 3 conversation far longer than its sliding window (issue 32).

    python -m bench.window_memory [--tokens 6144] [--json bench/out/window_memory.json] [--doc docs/benchmarks.md]

Gemma 3 270M (`MSTAR_MODEL=gemma3-270m`, the defaults: bf16 KV cache) prefills one prompt of
``--tokens`` tokens in 512-token chunks and decodes 64 more, on the engine as the service runs it.
After every step the KV cache's resident bytes are read with mincore(2) over its mappings (the CPU
cache's pages become resident when first written, models/kv_cache.py), twice in one run: with the
block manager's window release (the 15 windowed layers give back the pages of blocks they never
read again) and with it off (window 0: every layer keeps every block, what a global-attention
model of the same shape holds). The figure and table go to docs/.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import math
import mmap
import sys
from pathlib import Path

from bench import doc_sections

SECTION = "gemma3-window-memory"
FIGURE = Path("docs/gemma3_window_kv.png")
MB = 1024 * 1024
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def resident_bytes(mappings: list[mmap.mmap]) -> int:
    """Resident bytes of these anonymous mappings (mincore: one byte per page, bit 0 = resident)."""
    total = 0
    for m in mappings:
        pages = -(-len(m) // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        base = ctypes.c_char.from_buffer(m)
        try:
            if _libc.mincore(ctypes.c_void_p(ctypes.addressof(base)), ctypes.c_size_t(len(m)), vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            del base  # the buffer export, so the mapping stays closable
        total += sum(v & 1 for v in vec) * mmap.PAGESIZE
    return total


def run(checkpoint, prompt: list[int], release: bool, new_tokens: int = 64) -> list[tuple[int, int]]:
    """(tokens in the KV cache, resident KV bytes) after every step of one request."""
    from services.generation.engine import Engine, EngineConfig
    from services.generation.model_runner import ModelRunner, RunnerConfig
    from services.generation.sampling_params import SamplingParams

    blocks = math.ceil((len(prompt) + new_tokens) / 16) + 1
    runner = ModelRunner(checkpoint, RunnerConfig(num_blocks=blocks, block_size=16, device="cpu"))
    engine = Engine(runner, EngineConfig(num_blocks=blocks, block_size=16, max_num_seqs=1,
                                         max_num_batched_tokens=512), on_step=lambda out: None)
    if not release:
        engine.block_manager.window = 0  # every layer keeps every block
    engine.add_request(0, prompt, SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True))
    mappings = runner.kv_cache._mappings
    points = []
    while engine.seqs or not engine._commands.empty():
        engine.run_once()
        seq = next(iter(engine.seqs.values()), None)
        if seq is not None:
            points.append((seq.num_computed_tokens, resident_bytes(mappings)))
    return points


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=6144)
    p.add_argument("--json", type=Path)
    p.add_argument("--doc", type=Path)
    args = p.parse_args(argv)

    from pydoc_data.topics import topics

    from services.common.packaged_models import packaged_model_path
    from services.generation.weights.gguf import load_gguf
    from services.preprocess.model import load_model

    checkpoint = load_gguf(packaged_model_path("gemma3-270m"))
    tokenizer = load_model("gemma3-270m").tokenizer
    text = "\n\n".join(topics[k] for k in sorted(topics))
    prompt = tokenizer.encode(text)[: args.tokens]
    if len(prompt) < args.tokens:
        raise SystemExit(f"the topics text has only {len(prompt)} tokens")
    c = checkpoint.config
    per_token = 2 * c.num_kv_heads * c.head_dim * 2  # K and V, bf16, one layer
    windowed = sum(1 for i in range(c.num_layers) if c.window(i))
    curves = {"window release": run(checkpoint, prompt, True), "every block kept": run(checkpoint, prompt, False)}
    result = {"tokens": args.tokens, "window": c.sliding_window, "windowed_layers": windowed,
              "layers": c.num_layers, "bytes_per_token_per_layer": per_token,
              "curves": {k: [[t, b] for t, b in v] for k, v in curves.items()}}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result) + "\n")
    _figure(result, FIGURE)
    last = {k: v[-1] for k, v in curves.items()}
    for k, (t, b) in last.items():
        print(f"{k}: {t} tokens, {b / MB:.1f} MB resident KV")
    if args.doc:
        (t, kept), (_, released) = last["every block kept"], last["window release"]
        bound = (c.num_layers - windowed) * per_token * t + windowed * per_token * (c.sliding_window + 2 * 16)
        lines = [f"One Gemma 3 270M conversation of {t} tokens (window {c.sliding_window}; {windowed} of "
                 f"{c.num_layers} layers windowed; bf16 KV, 16-token blocks): resident KV bytes after every step, "
                 "read with mincore over the cache's mappings. `python -m bench.window_memory`.", "",
                 "| | resident KV at the end | per token |", "|---|---:|---:|",
                 f"| every block kept (a global-attention model's cache) | {kept / MB:.1f} MB | {kept / t / 1024:.1f} KiB |",
                 f"| window release (mstar) | {released / MB:.1f} MB | {released / t / 1024:.1f} KiB |",
                 f"| expected from the shapes: {c.num_layers - windowed} global layers x every token, {windowed} "
                 f"windowed x (window + 2 blocks) | {bound / MB:.1f} MB | |", "",
                 f"![resident KV against the conversation's length]({FIGURE.relative_to('docs')})"]
        doc_sections.write(args.doc, SECTION, "\n".join(lines))
    return 0


def _figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, points in result["curves"].items():
        ax.plot([t for t, _ in points], [b / MB for _, b in points], label=name)
    ax.axvline(result["window"], color="grey", linestyle=":", label=f"window ({result['window']})")
    ax.set_xlabel("tokens in the conversation")
    ax.set_ylabel("resident KV (MB)")
    ax.set_title("Gemma 3 270M: one long conversation's KV cache")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
