"""The model step as compiled code, built during warm-up: no per-op dispatch in the hot loop.

Two Steps (step.py: ``covers(batch)``, ``warm_up()``, ``is_warm``, ``__call__(batch) -> logits``;
neither covers a batch asking for hidden states, which runs eager):

  * CUDA (``CudaGraphDecode``, as nano-vllm): the forward is captured into one CUDA graph per
    bucket size (1, 2, 4, 8, 16, 32, 48, ... up to max_num_seqs), largest first, sharing one memory
    pool. A step of n rows runs the smallest bucket >= n: its inputs are copied into static buffers
    (``StaticDecodeInputs``) and the rows n..bucket-1 are padding (token 0, position 0, slot -1 so
    nothing is written to the cache, context length 0 so attention reads nothing). The graph reads
    its metadata only from those buffers, and the block-table width is fixed (max blocks per
    sequence), so one capture serves every context length. A step larger than the largest bucket
    runs eager.
    Prefill and mixed steps run eager there (CUDA graphs need static shapes).
  * CPU (``CompiledStep``), for every model but a GGUF served as its codes (that one runs as one
    C++ call per step instead: fused_step.py): torch.compile (Inductor: C++/OpenMP) of the forward with every
    dimension of the step's inputs unbacked-dynamic (tokens, sequences, logits rows, block-table
    width): ONE graph serves every step, decode, prefill and mixed, any batch and context (a
    dynamic but backed size would be specialised at 1: more graphs, more warm-up). No padding: on
    CPU there is no launch cost to amortise, and a padded row costs real matmul work. Every step
    running the same code also keeps a sequence's tokens independent of its batch-mates. Inductor's
    on-disk cache (the generation service keeps it in ~/.cache/mstar/inductor) makes a restart's
    compile a cache load; what remains is Dynamo tracing the 30 layers.

Both compile or capture during ``warm_up()`` (called by the runner before the service reports
SERVING) on inputs made only of padding rows, so warm-up never writes the KV cache.
"""

from __future__ import annotations

import logging
import time

import torch
import torch._inductor.config

from services.generation.graph_call import DirectCall, RecordingBackend
from services.generation.models.kv_cache import KVCache
from services.generation.models.llama import StepMetadata, Transformer
from services.generation.step import StepBatch
from services.generation.threads import usable_cpus

log = logging.getLogger(__name__)

_SERIAL_GRAPH_KERNELS_UP_TO_THREADS = 4


def bucket_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every 16 up to max_num_seqs (always included): nano-vllm's ladder."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return tuple(sorted(set(sizes) | {max_num_seqs}))


def bucket_for(n: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest bucket holding n rows, or None when n exceeds the largest (then: eager)."""
    return next((s for s in sizes if s >= n), None) if n > 0 else None


class StaticDecodeInputs:
    """Fixed buffers a captured decode graph reads: the step's tensors are copied in, padded.

    input_ids, positions, slot_mapping [R]; context_lens [R]; block_tables [R, W] with W the most
    blocks one sequence can hold; cu_seqlens_q = arange(R + 1) and logits_indices = arange(R)
    (one row per sequence, every row samples): constant, written once.
    """

    def __init__(self, max_rows: int, max_blocks: int, device: torch.device):
        self.max_rows, self.max_blocks = max_rows, max_blocks
        self.input_ids = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_rows,), -1, dtype=torch.int64, device=device)
        self.context_lens = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_rows, max_blocks, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(max_rows + 1, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(max_rows, dtype=torch.int64, device=device)

    def views(self, rows: int) -> tuple[torch.Tensor, StepMetadata]:
        """The first `rows` rows as the model's inputs (what a graph of that bucket is captured on)."""
        meta = StepMetadata(
            positions=self.positions[:rows], slot_mapping=self.slot_mapping[:rows],
            block_tables=self.block_tables[:rows], cu_seqlens_q=self.cu_seqlens_q[: rows + 1],
            context_lens=self.context_lens[:rows], logits_indices=self.logits_indices[:rows],
        )
        return self.input_ids[:rows], meta

    def fill(self, input_ids: torch.Tensor, meta: StepMetadata, rows: int) -> None:
        """Copy a decode step of n <= rows sequences in; rows n..rows-1 become padding."""
        n, width = input_ids.shape[0], meta.block_tables.shape[1]
        if n > rows or width > self.max_blocks:
            raise ValueError(f"a step of {n} rows x {width} blocks does not fit a bucket of {rows} x {self.max_blocks}")
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(meta.positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.context_lens[:n].copy_(meta.context_lens)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        # Padding rows: nothing stored (slot -1), nothing attended (context 0), a valid token id.
        self.input_ids[n:rows].zero_()
        self.positions[n:rows].zero_()
        self.slot_mapping[n:rows].fill_(-1)
        self.context_lens[n:rows].zero_()


def padding_step(rows: int, max_blocks: int, device: torch.device) -> tuple[torch.Tensor, StepMetadata]:
    """A decode step made only of padding rows: running it writes nothing and reads no cache."""
    inputs = StaticDecodeInputs(rows, max_blocks, device)
    return inputs.views(rows)


def _probe_of_distinct_sizes(device: torch.device) -> tuple[torch.Tensor, StepMetadata]:
    """A step whose unbacked sizes all differ (5 tokens, 2 sequences, 3 cu_seqlens, 1 logits row,
    4 blocks wide), so graph_call can tell which graph argument is which; it stores nothing."""
    def tensor(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device)

    meta = StepMetadata(
        positions=tensor([0, 1, 0, 1, 2], torch.int64), slot_mapping=tensor([-1] * 5, torch.int64),
        block_tables=torch.zeros(2, 4, dtype=torch.int32, device=device), cu_seqlens_q=tensor([0, 2, 5], torch.int32),
        context_lens=tensor([2, 3], torch.int32), logits_indices=tensor([4], torch.int64),
    )
    return torch.zeros(5, dtype=torch.int64, device=device), meta


def cuda_capture(run, pool):
    """Capture run() into a CUDA graph sharing memory pool `pool` -> (graph, its output tensor)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool):
        output = run()
    return graph, output


class CudaGraphDecode:
    """One CUDA graph per bucket size, replayed with the step's inputs copied into static buffers.

    capture: (run, pool) -> (graph with .replay() and .pool(), output); cuda_capture in serving,
    a stand-in in the CPU tests of everything around the capture itself."""

    name = "cuda-graphs"

    def __init__(self, model: Transformer, kv_cache: KVCache, max_num_seqs: int, max_blocks: int,
                 capture=cuda_capture):
        self.model, self.kv_cache, self.capture = model, kv_cache, capture
        self.sizes = bucket_sizes(max_num_seqs)
        self.device = kv_cache.k[0].device
        self.inputs = StaticDecodeInputs(self.sizes[-1], max_blocks, self.device)
        self.graphs: dict[int, object] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.is_warm = False

    def covers(self, batch: StepBatch) -> bool:
        """A pure decode step (one new token per sequence, every one sampled) that fits a bucket."""
        n, meta = batch.input_ids.shape[0], batch.meta
        return (not batch.hidden and batch.embeds is None and meta.logits_indices.shape[0] == n == meta.context_lens.shape[0]
                and bucket_for(n, self.sizes) is not None)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def warm_up(self) -> None:
        t0 = time.monotonic()
        pool = None
        for rows in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory
            input_ids, meta = self.inputs.views(rows)

            def run(input_ids=input_ids, meta=meta):
                return self.model.forward(input_ids, meta, self.kv_cache)  # [rows, V]

            run()  # compiles the Triton kernels outside the capture
            self._synchronize()
            self.graphs[rows], self.outputs[rows] = self.capture(run, pool)
            pool = self.graphs[rows].pool()
        self._synchronize()
        self.is_warm = True
        log.info("captured CUDA graphs", extra={"sizes": list(self.sizes), "seconds": round(time.monotonic() - t0, 1)})

    def __call__(self, batch: StepBatch) -> torch.Tensor:
        n = batch.input_ids.shape[0]
        rows = bucket_for(n, self.sizes)
        if batch.hidden:
            raise ValueError("the decode graphs return logits; a step asking for hidden states runs eager")
        if rows is None or rows not in self.graphs:
            raise ValueError(f"no captured decode graph holds {n} rows")
        self.inputs.fill(batch.input_ids, batch.meta, rows)
        self.graphs[rows].replay()
        return self.outputs[rows][:n]


_MODEL_GUARDS_KEPT = {"TYPE_MATCH", "CONSTANT_MATCH", "EQUALS_MATCH", "SEQUENCE_LENGTH", "CLASS_MATCH"}


def _guards_that_tell_models_apart(entries) -> list[bool]:
    """Dynamo checks ~3,000 guards per call of the default model's step (1.3 ms a step): per-tensor
    checks of every weight, "no hooks on this module", "attribute not shadowed", module globals.
    Keep the step's inputs, the KV-cache tensors, the global state, and the modules' types and
    constants (another model, other sizes or other numerics, fails those, so a graph is never
    reused for a model it was not traced on: Dynamo caches per code object, shared by every
    Transformer in the process); drop the rest, which cannot change for a runner's lifetime."""
    keep = []
    for e in entries:
        on_inputs = e.name == "" or e.name.startswith(("input_ids", "meta", "kv_cache"))
        keep.append(on_inputs or (e.name.startswith("self") and e.guard_type in _MODEL_GUARDS_KEPT))
    return keep


class CompiledStep:
    """torch.compile of the forward, every input dimension dynamic: one graph for every step."""

    name = "graph"

    def __init__(self, model: Transformer, kv_cache: KVCache, backend: str = "inductor"):
        """backend: torch.compile's; "aot_eager" in the fast tests (the same tracing, no C++ compile)."""
        self.model, self.kv_cache = model, kv_cache
        self.device = kv_cache.k[0].device
        # The wrapper's stride asserts on every op output: ~650 Python calls a step (0.5 ms at one row).
        torch._inductor.config.size_asserts = False
        if torch.get_num_threads() <= _SERIAL_GRAPH_KERNELS_UP_TO_THREADS:
            # The graph's own kernels (residual add + RMSNorm, SiLU x up, casts) run on the calling
            # thread; the matmuls and attention (kernels/cpu) still use every thread. At decode
            # sizes those kernels are microseconds of work, and an OpenMP fork/join around each of
            # the ~90 in a step cost more than splitting saved: on 2 threads, +10-13 % decode tok/s
            # at 1 and 16 rows (docs/benchmarks-engine.md). With many threads, prefill's
            # elementwise work is big enough to split, so larger machines keep Inductor's default.
            torch._inductor.config.cpp.threads = 1
        # The whole graph as one C++ call that releases the GIL (Inductor's Python wrapper holds it
        # through every fused kernel), so the serving event loop, which the engine wakes right
        # before the step (engine.py, runner.run's on_launch), never stalls the graph's own
        # Python. Measured through the stack at 1 stream (bench/hops.py, 4 interleaved pairs):
        # ITL p50 -1.2 ms (~9 %); each change alone gained nothing (the hand-off alone lost 1-3
        # ms). docs/design.md, "Threads and the GIL", says where the loop's work runs.
        torch._inductor.config.cpp_wrapper = True
        if usable_cpus() <= 4:
            # Inductor's pool of compile workers costs ~8 s to start on a 2-core box: more than the
            # parallel C++ compiles win there, and the warm (cached) restart needs no compiler at all.
            torch._inductor.config.compile_threads = 1
        self.backend = RecordingBackend(backend)
        self.compiled = torch.compile(model.forward, fullgraph=True, dynamic=False, backend=self.backend,
                                      options={"guard_filter_fn": _guards_that_tell_models_apart})
        self.direct: DirectCall | None = None  # the graph without Dynamo's entry (graph_call.py), once warm
        self.is_warm = False

    def covers(self, batch: StepBatch) -> bool:
        return batch.input_ids.shape[0] > 0 and not batch.hidden and batch.embeds is None  # images: eager

    @torch.inference_mode()
    def warm_up(self) -> None:
        t0 = time.monotonic()
        self(StepBatch(*padding_step(2, 2, self.device)))
        # Both probes write nothing (every slot -1) and read only what they may: at warm-up the
        # cache holds no request's data.
        self.direct = DirectCall.build(self.backend, self._through_dynamo,
                                       [_probe_of_distinct_sizes(self.device), padding_step(3, 2, self.device)])
        self.is_warm = True
        log.info("compiled the model step", extra={"seconds": round(time.monotonic() - t0, 1),
                                                   "direct_call": self.direct is not None})

    def __call__(self, batch: StepBatch) -> torch.Tensor:
        if batch.hidden:
            raise ValueError("the compiled graph returns logits; a step asking for hidden states runs eager")
        # The graph was traced on contiguous inputs; its guards check strides too.
        input_ids, meta = batch.input_ids.contiguous(), batch.meta
        meta = StepMetadata(*(t.contiguous() for t in (meta.positions, meta.slot_mapping, meta.block_tables,
                                                      meta.cu_seqlens_q, meta.context_lens, meta.logits_indices)))
        if self.is_warm and self.direct is not None and self.direct.accepts(input_ids, meta):
            return self.direct(input_ids, meta)
        return self._through_dynamo(input_ids, meta)

    def _through_dynamo(self, input_ids: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        for t in (input_ids, meta.positions, meta.slot_mapping, meta.context_lens, meta.logits_indices,
                  meta.block_tables, meta.cu_seqlens_q):
            torch._dynamo.decorators.mark_unbacked(t, 0)  # each its own size: tokens, sequences, rows
        torch._dynamo.decorators.mark_unbacked(meta.block_tables, 1)
        if not self.is_warm:
            return self.compiled(input_ids, meta, self.kv_cache)
        # Serving: a step that would need a new graph runs eagerly; nothing compiles inside a step.
        with torch.compiler.set_stance("eager_on_recompile"):
            return self.compiled(input_ids, meta, self.kv_cache)
