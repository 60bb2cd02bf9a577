"""Build a step's tensors from the scheduled sequences, run the model over the paged cache, sample.

Step tensors are assembled as Python lists and converted with one torch.tensor call each (no per
token tensor ops); decode rows and prefill chunks share one flat [T] batch.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from kernels import cpu
from kernels.dispatch import KernelOps
from services.generation.compiled_step import CompiledStep, CudaGraphDecode
from services.generation.fused_step import FusedStep, fusable
from services.generation.models.kv_cache import KVCache
from services.generation.models.linear import Quantized
from services.generation.models.llama import StepMetadata, Transformer
from services.generation.models.vision import VisionEncoder
from services.generation.numerics import choose, resolve_device
from services.generation.outputs import SampleOutput
from services.generation.sampler import Sampler
from services.generation.sequence import Sequence
from services.generation.step import EagerStep, Step, StepBatch
from services.generation.step_choice import choose_step, numerics_kind
from services.generation.threads import default_threads
from services.generation.weights.checkpoint import Checkpoint

log = logging.getLogger(__name__)
ENCODER_CACHE_IMAGES = 32  # encoded images kept by content hash (a 17-tile SmolVLM image: 2.5 MB)


@dataclass
class RunnerConfig:
    num_blocks: int = 1024
    block_size: int = 16
    device: str = "auto"  # auto: cuda when available, else cpu
    num_threads: int | None = None  # torch intra-op threads on CPU; None: threads.default_threads()
    force_triton: bool = False  # run the Triton kernels under TRITON_INTERPRET=1 (tests)
    dtype: str = "auto"  # auto | float32 | bfloat16 (activations); numerics.py
    kv_cache_dtype: str = "auto"  # auto (bf16 for a GGUF's codes, else the activations') | float32 | bfloat16
    quantization: str = "auto"  # auto (a GGUF's own blocks) | gguf (required) | none (dense)
    kernels: str = "auto"  # auto | cpu | reference (the HF oracle) | triton
    step: str = "auto"  # auto | eager | graph | fused: how a step runs (step_choice.py's table)
    max_num_seqs: int = 64  # the largest decode batch a graph must hold
    # How an embedding request pools the final hidden states (after the final norm) of its prompt:
    # mean (every prompt token; the default, see docs/design.md "Embeddings") or last (the last token).
    pooling: str = "mean"


POOLINGS = ("mean", "last")


@dataclass
class StepRows:
    """What one step's model run leaves for the per-request work: the logits of the sequences
    that sample (row i = the i-th of them), and the pooled final hidden states of those that pool."""

    logits: torch.Tensor | None  # [S, V] fp32; None (or S = 0) when no sequence samples
    pooled: list[torch.Tensor] = field(default_factory=list)  # one [H] per pooling sequence


def normalized(pooled: torch.Tensor, dimensions: int | None) -> bytes | None:
    """An embedding from a pooled hidden state [H]: its first `dimensions` values (all when None),
    L2-normalized in fp32, as float32 little-endian bytes; None when it is not finite."""
    x = pooled.float()[:dimensions]
    if not bool(torch.isfinite(x).all()):
        return None
    return torch.nn.functional.normalize(x, dim=-1).cpu().numpy().astype("<f4").tobytes()


class ModelRunner:
    def __init__(self, checkpoint: Checkpoint, config: RunnerConfig):
        if config.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}; got {config.pooling!r}")
        self.config = config
        self.model_config = checkpoint.config
        self.vocabulary = checkpoint.vocabulary  # for structured output (the engine's grammar compiler)
        kernels = "triton" if config.force_triton else config.kernels
        cpu_error = cpu.load_error() if kernels in ("auto", "cpu") and resolve_device(config.device).type == "cpu" else None
        self.numerics = choose(checkpoint, config.device, config.dtype, config.quantization, kernels,
                               cpu_kernels_error=cpu_error, kv_cache_dtype=config.kv_cache_dtype)
        self.device, self.dtype = self.numerics.device, self.numerics.dtype
        if self.device.type == "cpu":
            torch.set_num_threads(config.num_threads or default_threads())
        self.ops = KernelOps.create(self.device, backend=self.numerics.kernels)
        self.block_size = config.block_size
        self.max_blocks = -(-checkpoint.config.max_position_embeddings // config.block_size)
        with torch.inference_mode():
            self.model = Transformer(checkpoint.config, self.ops, checkpoint.tensors, self.device, self.dtype,
                                     checkpoint.blocks, quantized=self.numerics.quantized)
            self.kv_cache = KVCache(checkpoint.config, config.num_blocks, config.block_size, self.device,
                                    self.numerics.kv_cache_dtype)
        self.sampler = Sampler(self.ops, self.device)
        # A vision-language checkpoint's image encoder (models/vision.py) and its outputs by image
        # content hash: a repeated image (a conversation's next turn, many users asking about one
        # picture) is encoded once while it stays among the most recent ENCODER_CACHE_IMAGES.
        vision = checkpoint.vision
        self.vision = VisionEncoder(vision.config, vision.tensors, self.device, self.dtype) if vision else None
        self.image_token_id = vision.image_token_id if vision else None
        self.normalization = vision.normalization if vision else None
        self.encoder_cache: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.num_images_encoded = 0
        self.eager = EagerStep(self.model, self.kv_cache)  # what runs a batch the chosen step does not cover
        self.step_choice = choose_step(self.device.type, numerics_kind(self.numerics.kernels,
                                                                       fusable(self.model, self.kv_cache)), config.step)
        self.step: Step = {  # the step the table's row names, not yet warm (warm_up builds it)
            "eager": lambda: self.eager,
            "graph": lambda: CompiledStep(self.model, self.kv_cache),
            "fused": lambda: FusedStep(self.model, self.kv_cache),
            "cuda-graphs": lambda: CudaGraphDecode(self.model, self.kv_cache, config.max_num_seqs, self.max_blocks),
        }[self.step_choice.step]()
        log.info(f"{self.numerics.describe()}; step {self.step.name}: {self.step_choice.why}",
                 extra={"threads": torch.get_num_threads(), "step": self.step.name, "step_mode": config.step})

    def warm_up(self) -> None:
        """Compile the step / capture the decode graphs (part of readiness: not SERVING yet)."""
        self.step.warm_up()

    def numerics_metadata(self) -> str:
        """The Stream's initial metadata (numerics.Numerics.as_metadata): compiled_decode unless eager."""
        return self.numerics.as_metadata(compiled_decode=self.step.name != "eager")

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.model_config.eos_token_ids

    @property
    def max_model_len(self) -> int:
        return self.model_config.max_position_embeddings

    @property
    def hidden_size(self) -> int:
        return self.model_config.hidden_size

    def prepare(self, seqs: list[Sequence], num_new_tokens: list[int], sampling: list[bool] | list[int]):
        """Step tensors for seqs computing num_new_tokens each; final hidden states (and logits) at
        the last sampling[i] rows of seq i (True = its last row, False = none).

        A verify step's rows (its last token, then its proposal: speculation.py) go in as one
        single-row sequence each, of contexts p + 1 for its positions p: decode rows to every kernel
        (the same arithmetic, so the same bits, as decoding them one step at a time; CUDA graphs
        and the CPU attention's register path take them as they take decode rows)."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu_seqlens = [0]
        context_lens: list[int] = []
        logits_indices: list[int] = []
        tables: list[list[int]] = []
        for seq, n, is_sampling in zip(seqs, num_new_tokens, sampling, strict=True):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            input_ids.extend(seq.token_ids[start:end])
            input_ids.extend(seq.proposal[:end - max(start, len(seq))])
            positions.extend(range(start, end))
            table = seq.block_table
            for b in range(start // bs, (end - 1) // bs + 1):  # one range per touched block
                lo, hi = max(start, b * bs), min(end, (b + 1) * bs)
                base = table[b] * bs - b * bs
                slots.extend(range(base + lo, base + hi))
            rows = [(p, p + 1) for p in range(start, end)] if seq.proposal else [(start, end)]
            for lo, hi in rows:
                cu_seqlens.append(cu_seqlens[-1] + hi - lo)
                context_lens.append(hi)
                tables.append(table)
            logits_indices.extend(range(cu_seqlens[-1] - int(is_sampling), cu_seqlens[-1]))
        width = max(len(t) for t in tables)
        tables = [t + [0] * (width - len(t)) for t in tables]
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

    @property
    def tokens_per_tile(self) -> int | None:
        """Image tokens per tile of a vision-language model; None for a text-only one."""
        return self.vision.config.tokens_per_tile if self.vision else None

    @property
    def tile_bytes(self) -> int | None:
        """The bytes of one uint8 image tile on the wire (wire.TILE_MIME_TYPE); None: text only."""
        return 3 * self.vision.config.image_size ** 2 if self.vision else None

    def image_embeds(self, seqs: list[Sequence], num_new_tokens: list[int]):
        """(batch rows, embeddings) for the image tokens among the step's rows, first encoding, in
        one batched call, the images those rows need that are not encoded yet (encoder cache
        first); None when the step has no image token."""
        work = []  # (seq, first row of its chunk, lo, hi: its image-token indices in the chunk)
        missing = []  # (images, k) not encoded yet
        offset = 0
        for seq, n in zip(seqs, num_new_tokens, strict=True):
            images, start = seq.images, seq.num_computed_tokens
            if images is not None and start <= images.positions[-1]:
                lo, hi = bisect_left(images.positions, start), bisect_left(images.positions, start + n)
                if hi > lo:
                    work.append((seq, offset - start, lo, hi))
                    missing += [(images, k) for k in images.needed(start, start + n) if images.features[k] is None]
            offset += n
        if not work:
            return None
        if missing:
            self._encode(missing)
        rows, values = [], []
        for seq, shift, lo, hi in work:
            images = seq.images
            rows.extend(p + shift for p in images.positions[lo:hi])
            for k in images.needed(images.positions[lo], images.positions[hi - 1] + 1):
                first, last = images.spans[k]
                values.append(images.features[k][max(lo, first) - first:min(hi, last) - first])
        return torch.tensor(rows, dtype=torch.int64, device=self.device), torch.cat(values)

    def _encode(self, missing) -> None:
        """Each (images, k)'s image-token embeddings [tiles x tokens_per_tile, H]: from the encoder
        cache, else from one batched encoder call over every missing image's tiles."""
        todo = {}
        for images, k in missing:
            image = images.images[k]
            if image.content_hash not in self.encoder_cache:
                todo.setdefault(image.content_hash, image)
        if todo:
            side = self.vision.config.image_size
            tiles = np.frombuffer(b"".join(im.tiles for im in todo.values()), np.uint8).reshape(-1, 3, side, side)
            encoded = self.vision(torch.from_numpy(self.normalization.apply(tiles)))  # [tiles, tokens, H]
            start = 0
            for content_hash, image in todo.items():
                n = image.num_tiles
                self.encoder_cache[content_hash] = encoded[start:start + n].reshape(-1, encoded.shape[-1])
                start += n
                self.num_images_encoded += 1
        for images, k in missing:
            content_hash = images.images[k].content_hash
            self.encoder_cache.move_to_end(content_hash)
            images.features[k] = self.encoder_cache[content_hash]
        while len(self.encoder_cache) > ENCODER_CACHE_IMAGES:
            self.encoder_cache.popitem(last=False)

    def forward(self, input_ids: torch.Tensor, meta: StepMetadata, embeds=None) -> torch.Tensor:
        """Logits [S, V] fp32 of one step (what fault injection wraps: faults.py)."""
        return self.rows(StepBatch(input_ids, meta, embeds=embeds))

    def rows(self, batch: StepBatch) -> torch.Tensor:
        """The chosen step's rows for batch once warm_up() built it and when it covers batch (nothing
        compiles inside a step), else the eager step's."""
        step = self.step if self.step.is_warm and self.step.covers(batch) else self.eager
        return step(batch)

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], num_new_tokens: list[int], sampling: list[bool],
            pooling: list[bool] | None = None, on_launch: Callable[[], None] | None = None) -> StepRows:
        """Compute the scheduled tokens over the paged cache: the logits of each seq with
        sampling[i] True, and the pooled final hidden state of each seq with pooling[i] True (an
        embedding request whose prompt ends in this step). Mean pooling adds every step's rows of
        an embedding request to its running sum (seq.pooled), so chunked prefill pools exactly the
        rows a single pass would. on_launch is called once the inputs are ready, right before the
        model runs. This is the step's shared work (the model over the KV cache); what is then
        done per request (sample, embedding) runs behind the engine's fault boundary."""
        on_launch = on_launch or (lambda: None)
        embeds = self.image_embeds(seqs, num_new_tokens) if self.vision is not None else None
        if not any(seq.is_embedding for seq in seqs):  # logits only
            input_ids, meta = self.prepare(seqs, num_new_tokens, sampling)
            on_launch()
            return StepRows(self.forward(input_ids, meta, embeds))  # [S, V]; S = 0 when no row samples
        pooling = pooling or [False] * len(seqs)
        mean = self.config.pooling == "mean"
        rows = [n if seq.is_embedding and mean else int(is_sampling or is_pooling)
                for seq, n, is_sampling, is_pooling in zip(seqs, num_new_tokens, sampling, pooling, strict=True)]
        input_ids, meta = self.prepare(seqs, num_new_tokens, rows)
        on_launch()
        # An embedding request needs final hidden states (every prompt row, for mean pooling), so
        # the step asks for them, also for the generation rows sharing it (their logits follow from
        # theirs below). Steps that return only logits do not cover such a batch: it runs eager.
        # Grammar masks are applied by the sampler after the logits either way.
        hidden = self.rows(StepBatch(input_ids, meta, hidden=True, embeds=embeds))  # [sum(rows), H]
        sample_rows, pooled, end = [], [], 0
        for seq, k, is_sampling, is_pooling in zip(seqs, rows, sampling, pooling, strict=True):
            end += k
            if not seq.is_embedding:
                sample_rows.extend(range(end - int(is_sampling), end))  # 1 + len(proposal) rows
                continue
            if mean and k:
                chunk = hidden[end - k:end].float().sum(dim=0)
                seq.pooled = chunk if seq.pooled is None else seq.pooled + chunk
            if is_pooling:
                pooled.append(seq.pooled / seq.num_prompt_tokens if mean else hidden[end - 1])
        return StepRows(self.model.logits(hidden[sample_rows]) if sample_rows else None, pooled)

    @torch.inference_mode()
    def sample(self, rows: StepRows, seqs: list[Sequence], indices: list[int],
               ahead: list[tuple[int, ...]] | None = None) -> SampleOutput:
        """The tokens (and logprobs) of seqs, drawn from rows.logits[indices] (one per seq);
        ahead[i]: proposed tokens row i comes after (a verify step's rows, sampler.py)."""
        logits = rows.logits if indices == list(range(rows.logits.shape[0])) else rows.logits[indices]
        return self.sampler(logits, seqs, ahead)

    @torch.inference_mode()
    def greedy_tokens(self, rows: StepRows, grammars: list | None = None,
                      ahead: list[tuple[int, ...]] | None = None) -> list[int]:
        """Each sampling row's most likely token (a draft model's proposals: draft.py); with
        grammars[i], among the tokens it allows after ahead[i] (grammar/bitmask.py)."""
        logits = rows.logits
        if grammars and any(g is not None for g in grammars):
            self.sampler.token_masks.apply(logits, grammars, ahead)
        return logits.argmax(dim=-1).tolist()

    def embedding(self, rows: StepRows, index: int, seq: Sequence) -> bytes | None:
        """The embedding of the index-th pooling seq of the step (None: not finite)."""
        return normalized(rows.pooled[index], seq.params.embedding.dimensions)

    def clear_blocks(self, block_ids: list[int]) -> None:
        with torch.inference_mode():
            self.kv_cache.clear_blocks(block_ids)

    def release_blocks(self, block_ids: list[int]) -> int:
        """Give free blocks' memory back to the OS (a CPU cache's pages); returns the bytes released."""
        return self.kv_cache.release_blocks(block_ids)

    @property
    def window(self) -> int:
        """The sliding-window layers' window in keys (0: none): the block manager's window release."""
        config = self.model.config
        return config.sliding_window if any(config.window(i) for i in range(config.num_layers)) else 0

    @property
    def verify_rows_exact(self) -> bool:
        """A speculative verify row gets a decode row's bits (speculation.py): the CPU kernels on a
        step that covers verify batches, every matmul block codes (quant_matmul treats each row
        alike; a dense F.linear blocks a 5-row GEMM unlike a 1-row GEMV, 1e-6 apart)."""
        m = self.model
        matmuls = [m.lm_head, *(p for b in m.blocks for p in (b.attention.qkv_proj, b.attention.o_proj,
                                                              b.ffn.gate_up_proj, b.ffn.down_proj))]
        return (self.device.type == "cpu" and self.numerics.kernels == "cpu" and self.step_choice.step in ("fused", "eager")
                and all(isinstance(p, Quantized) for p in matmuls))

    @property
    def every_layer_windowed(self) -> bool:
        """No layer reads keys beyond the window (Mistral): passed blocks are reused (block_manager.py)."""
        config = self.model.config
        return all(config.window(i) for i in range(config.num_layers))

    def release_window_blocks(self, block_ids: list[int]) -> int:
        """The sliding-window layers' pages of blocks none of them reads again (block_manager.py)."""
        config = self.model.config
        layers = [i for i in range(config.num_layers) if config.window(i)]
        return self.kv_cache.release_blocks(block_ids, layers)
