"""The model step: one interface for every way the decoder runs a step (docs/design.md, "Step").

    batch = StepBatch(input_ids, meta)              # what ModelRunner.prepare builds
    rows = step(batch)                              # logits [S, V] fp32 at meta.logits_indices
    rows = step(StepBatch(input_ids, meta, hidden=True))  # final hidden states [S, H] instead

Implementations: ``EagerStep`` (here: the model op by op through KernelOps, any backend),
``CompiledStep`` (the Inductor graph) and ``CudaGraphDecode`` (CUDA graphs) in compiled_step.py,
``FusedStep`` (KernelOps.decoder_stack) in fused_step.py. step_choice.py picks one per runner; the
runner runs a batch the chosen step does not cover (or before it is warm) eagerly, so a step only
says what it covers and never decides for another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from services.generation.models.kv_cache import KVCache
from services.generation.models.llama import StepMetadata, Transformer


@dataclass(frozen=True)
class StepBatch:
    """One step's input: the scheduled tokens of every sequence as one flat batch, where they sit
    (StepMetadata), and what the caller wants back at meta.logits_indices."""

    input_ids: torch.Tensor  # [T] int64
    meta: StepMetadata
    hidden: bool = False  # True: the final hidden states [S, H] (embedding requests pool them), not logits
    # Image embeddings in place of some rows' token embeddings: (row indices [R] int64, [R, H]);
    # a vision-language prompt's image tokens (image_inputs.py). None: every row embeds its token.
    embeds: tuple[torch.Tensor, torch.Tensor] | None = None


class Step(Protocol):
    """A way to run the model over the paged KV cache for one StepBatch."""

    name: str  # "eager" | "graph" | "fused" | "cuda-graphs": what the start-up log line reports
    is_warm: bool  # built (compiled, captured) and safe to call inside an engine step

    def covers(self, batch: StepBatch) -> bool:
        """Whether this step runs batch (else the runner runs it eagerly)."""
        ...

    def warm_up(self) -> None:
        """Build whatever the step needs (compile, capture) before SERVING; writes no KV cache."""
        ...

    def __call__(self, batch: StepBatch) -> torch.Tensor:
        """logits [S, V] fp32, or with batch.hidden the final hidden states [S, H], at meta.logits_indices."""
        ...


class EagerStep:
    """The model op by op (models/llama.py through KernelOps): covers every batch, nothing to build."""

    name = "eager"
    is_warm = True

    def __init__(self, model: Transformer, kv_cache: KVCache):
        self.model, self.kv_cache = model, kv_cache

    def covers(self, batch: StepBatch) -> bool:
        return True

    def warm_up(self) -> None:
        pass

    def __call__(self, batch: StepBatch) -> torch.Tensor:
        if batch.hidden:
            return self.model.final_hidden(batch.input_ids, batch.meta, self.kv_cache, batch.embeds)
        return self.model.forward(batch.input_ids, batch.meta, self.kv_cache, batch.embeds)
