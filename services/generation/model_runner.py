"""Build a step's tensors from the scheduled sequences, run the model over the paged cache, sample.

Step tensors are assembled as Python lists and converted with one torch.tensor call each (no per
token tensor ops); decode rows and prefill chunks share one flat [T] batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from kernels import cpu
from kernels.dispatch import KernelOps
from services.generation.compiled_step import CompiledStep, CudaGraphDecode
from services.generation.models.llama import KVCache, StepMetadata, Transformer
from services.generation.numerics import choose, resolve_device
from services.generation.sampler import SampleOutput, Sampler
from services.generation.sequence import Sequence
from services.generation.threads import default_threads
from services.generation.weights.checkpoint import Checkpoint

log = logging.getLogger(__name__)


@dataclass
class RunnerConfig:
    num_blocks: int = 1024
    block_size: int = 16
    device: str = "auto"  # auto: cuda when available, else cpu
    num_threads: int | None = None  # torch intra-op threads on CPU; None: threads.default_threads()
    force_triton: bool = False  # run the Triton kernels under TRITON_INTERPRET=1 (tests)
    dtype: str = "auto"  # auto | float32 | bfloat16 (activations and KV cache); numerics.py
    quantization: str = "auto"  # auto (a GGUF's own blocks) | gguf (required) | none (dense)
    kernels: str = "auto"  # auto | cpu | reference (the HF oracle) | triton
    compile: bool = True  # the step as compiled code (compiled_step.py); False: eager
    max_num_seqs: int = 64  # the largest decode batch a graph must hold


class ModelRunner:
    def __init__(self, checkpoint: Checkpoint, config: RunnerConfig):
        self.config = config
        self.model_config = checkpoint.config
        self.vocabulary = checkpoint.vocabulary  # for structured output (the engine's grammar compiler)
        kernels = "triton" if config.force_triton else config.kernels
        cpu_error = cpu.load_error() if kernels in ("auto", "cpu") and resolve_device(config.device).type == "cpu" else None
        self.numerics = choose(checkpoint, config.device, config.dtype, config.quantization, kernels, config.compile,
                               cpu_kernels_error=cpu_error)
        self.device, self.dtype = self.numerics.device, self.numerics.dtype
        if self.device.type == "cpu":
            torch.set_num_threads(config.num_threads or default_threads())
        self.ops = KernelOps.create(self.device, backend=self.numerics.kernels)
        self.block_size = config.block_size
        self.max_blocks = -(-checkpoint.config.max_position_embeddings // config.block_size)
        with torch.inference_mode():
            self.model = Transformer(checkpoint.config, self.ops, checkpoint.tensors, self.device, self.dtype,
                                     checkpoint.blocks, quantized=self.numerics.quantized)
            self.kv_cache = KVCache(checkpoint.config, config.num_blocks, config.block_size, self.device, self.dtype)
        self.sampler = Sampler(self.ops, self.device)
        self.compiled: CompiledStep | CudaGraphDecode | None = None
        if self.numerics.compiled and self.device.type == "cuda":
            self.compiled = CudaGraphDecode(self.model, self.kv_cache, config.max_num_seqs, self.max_blocks)
        elif self.numerics.compiled:
            self.compiled = CompiledStep(self.model, self.kv_cache)
        log.info(self.numerics.describe(), extra={"threads": torch.get_num_threads()})

    def warm_up(self) -> None:
        """Compile the step / capture the decode graphs (part of readiness: not SERVING yet)."""
        if self.compiled is not None:
            self.compiled.warm_up()

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.model_config.eos_token_ids

    @property
    def max_model_len(self) -> int:
        return self.model_config.max_position_embeddings

    def prepare(self, seqs: list[Sequence], num_new_tokens: list[int], sampling: list[bool]):
        """Step tensors for seqs computing num_new_tokens each; logits at the sampling ones' last row."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu_seqlens = [0]
        context_lens: list[int] = []
        logits_indices: list[int] = []
        for seq, n, is_sampling in zip(seqs, num_new_tokens, sampling, strict=True):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            for b in range(start // bs, (end - 1) // bs + 1):  # one range per touched block
                lo, hi = max(start, b * bs), min(end, (b + 1) * bs)
                base = table[b] * bs - b * bs
                slots.extend(range(base + lo, base + hi))
            cu_seqlens.append(cu_seqlens[-1] + n)
            context_lens.append(end)
            if is_sampling:
                logits_indices.append(cu_seqlens[-1] - 1)
        width = max(len(s.block_table) for s in seqs)
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
        dev = self.device
        meta = StepMetadata(
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            cu_seqlens_q=torch.tensor(cu_seqlens, dtype=torch.int32, device=dev),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=dev),
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=dev),
        )
        return torch.tensor(input_ids, dtype=torch.int64, device=dev), meta

    def forward(self, input_ids: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        """Logits [S, V] fp32 of one step: compiled code when it covers the step, else eager."""
        compiled = self.compiled  # used once warm_up() built it: nothing compiles inside a step
        if compiled is not None and compiled.is_warm and compiled.covers(input_ids, meta):
            return compiled(input_ids, meta)
        return self.model.forward(input_ids, meta, self.kv_cache)

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], num_new_tokens: list[int], sampling: list[bool]) -> SampleOutput:
        """Compute the scheduled tokens; sample one token for each seq with sampling[i] True."""
        input_ids, meta = self.prepare(seqs, num_new_tokens, sampling)
        logits = self.forward(input_ids, meta)  # [S, V]
        sampled = [s for s, is_sampling in zip(seqs, sampling, strict=True) if is_sampling]
        if not sampled:
            return SampleOutput([], [], [])
        return self.sampler(logits, sampled)

    def clear_blocks(self, block_ids: list[int]) -> None:
        with torch.inference_mode():
            self.kv_cache.clear_blocks(block_ids)
