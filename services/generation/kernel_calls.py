"""The KernelOps calls the model makes, as data for the AOT compile gate (kernels/aot/kernel_calls.json).

    python -m services.generation.kernel_calls          # rewrite the file after a model change

kernels/ may not import the model (it sits above them), yet the gate must compile every launch the
engine can make. So this side runs one engine step per shape in STEPS through the model on meta
tensors, for every supported model shape, dtype and KV page size, with a KernelOps whose ops plan
(kernels/aot/matrix.py's PlanningOps, for their outputs) and record each call. The gate replays the
calls per GPU. tests/unit/generation/test_kernel_calls.py fails when the file is not what this writes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from kernels.aot.matrix import CALLS_PATH, META, PlanningOps, describe
from kernels.dispatch import KernelOps
from kernels.launch import H200
from kernels.shapes import BLOCK_SIZES, DTYPES, SUPPORTED, ModelShape
from services.generation.models.config import DecoderConfig
from services.generation.models.kv_cache import KVCache
from services.generation.models.llama import StepMetadata, Transformer


@dataclass(frozen=True)
class Step:
    """One engine step's shape: T scheduled tokens over B sequences, block tables for max_context."""

    name: str
    tokens: int
    seqs: int
    max_context: int


# Decode-only batches (T == B) from one sequence to a full batch, short and long contexts (1 to 32
# splits); prefill chunks alone and mixed with decode rows (the scheduler's chunked prefill).
STEPS = (
    Step("decode B=1 ctx=512", 1, 1, 512),
    Step("decode B=1 ctx=32k", 1, 1, 32768),
    Step("decode B=16 ctx=16k", 16, 16, 16384),
    Step("decode B=256 ctx=2k", 256, 256, 2048),
    Step("prefill 512", 512, 1, 512),
    Step("prefill chunk 2048 at 32k", 2048, 1, 32768),
    Step("4 decode + 256-token chunk", 260, 5, 4096),
)


def record() -> dict:
    """{"calls": distinct op calls, "steps": [{model, dtype, block_size, step, calls: indices}]}."""
    calls: list[dict] = []
    index: dict[str, int] = {}
    steps = []
    for model in SUPPORTED:
        config = _config(model)
        weights = {name: torch.empty(shape, device=META) for name, shape in config.expected_shapes().items()}
        for dtype in DTYPES:
            recorder = _RecordingOps()
            transformer = Transformer(config, recorder.kernel_ops, weights, META, dtype)
            for block_size in BLOCK_SIZES:
                for step in STEPS:
                    recorder.calls = []
                    _run_step(transformer, recorder.kernel_ops, block_size, step)
                    used = []
                    for call in recorder.calls:
                        key = json.dumps(call)
                        used.append(index.setdefault(key, len(calls)))
                        if used[-1] == len(calls):
                            calls.append(call)
                    steps.append({"model": model.name, "dtype": str(dtype).removeprefix("torch."),
                                  "block_size": block_size, "step": step.name, "calls": used})
    return {"calls": calls, "steps": steps}


def render(document: dict) -> str:
    """The file's text: one call or step a line, so a model change reads as a small diff."""
    lines = [json.dumps(x, separators=(",", ":")) for x in document["calls"]]
    steps = [json.dumps(x, separators=(",", ":")) for x in document["steps"]]
    return '{"calls": [\n' + ",\n".join(lines) + '\n], "steps": [\n' + ",\n".join(steps) + "\n]}\n"


def _run_step(transformer: Transformer, ops: KernelOps, block_size: int, step: Step) -> None:
    """One engine step through the model (2 layers: the first block's norm differs), then the draw."""
    width = math.ceil(step.max_context / block_size)
    kv_cache = KVCache(transformer.config, step.seqs * width, block_size, META, transformer.embed.dtype)
    meta = StepMetadata(
        positions=torch.empty(step.tokens, dtype=torch.int64, device=META),
        slot_mapping=torch.empty(step.tokens, dtype=torch.int64, device=META),
        block_tables=torch.empty(step.seqs, width, dtype=torch.int32, device=META),
        cu_seqlens_q=torch.empty(step.seqs + 1, dtype=torch.int32, device=META),
        context_lens=torch.empty(step.seqs, dtype=torch.int32, device=META),
        logits_indices=torch.empty(step.seqs, dtype=torch.int64, device=META),
    )
    logits = transformer.forward(torch.empty(step.tokens, dtype=torch.int64, device=META), meta, kv_cache)
    rows = logits.shape[0]
    column = torch.empty(rows, device=META)
    ints = torch.empty(rows, dtype=torch.int64, device=META)
    ops.sample(logits, column, ints, column, column, ints, ints)


def _config(model: ModelShape) -> DecoderConfig:
    windows = {}
    if model.window:  # one windowed and one global layer: both kinds of attention call
        windows = dict(sliding_window=model.window, layer_types=("sliding_attention", "full_attention"),
                       rope_local_theta=10000.0)
    return DecoderConfig(
        vocab_size=model.vocab, hidden_size=model.hidden, intermediate_size=model.ffn, num_layers=2,
        num_heads=model.q_heads, num_kv_heads=model.kv_heads, head_dim=model.head_dim, rms_norm_eps=1e-5,
        rope_theta=500000.0, max_position_embeddings=32768, tie_word_embeddings=False, family=model.family,
        **windows,
    )


class _RecordingOps:
    """A KernelOps on meta tensors whose every op call is recorded, then planned for its outputs."""

    def __init__(self):
        self.calls: list[dict] = []
        self._planning = PlanningOps(H200)  # outputs' shapes and layouts do not depend on the target
        self.kernel_ops = KernelOps(META, "aot", {op: self._recorded(op, fn) for op, fn in self._planning.table().items()})

    def _recorded(self, op, fn):
        def call(*args):
            self.calls.append(describe(op, args))
            return fn(*args)
        return call


if __name__ == "__main__":
    CALLS_PATH.write_text(render(record()))
    print(f"wrote {CALLS_PATH}")
