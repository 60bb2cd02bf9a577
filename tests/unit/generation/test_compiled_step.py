"""The step as compiled code (compiled_step.py), everything that runs without a GPU: bucket choice,
padding, the static metadata a captured CUDA graph reads, capture/replay around a stand-in capture,
the torch.compile graph serving every step (traced with aot_eager here; Inductor in slow tests),
and the eager fallback."""

from __future__ import annotations

import pytest
import torch
from generation_helpers import drive

from services.generation.compiled_step import (
    CompiledStep,
    CudaGraphDecode,
    StaticDecodeInputs,
    bucket_for,
    bucket_sizes,
)
from services.generation.engine import Engine, EngineConfig
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.models.llama import StepMetadata
from services.generation.sampling_params import Embedding, SamplingParams
from services.generation.step import StepBatch


def test_buckets_are_nano_vllms_ladder_up_to_the_batch_limit():
    assert bucket_sizes(64) == (1, 2, 4, 8, 16, 32, 48, 64)
    assert bucket_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert bucket_sizes(1) == (1,)
    sizes = bucket_sizes(64)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 9, 17, 33, 64)] == [1, 2, 4, 8, 16, 32, 48, 64]
    assert bucket_for(65, sizes) is None and bucket_for(0, sizes) is None


def _decode_meta(contexts: list[int], block_size: int, tables: list[list[int]]) -> StepMetadata:
    positions = [c - 1 for c in contexts]
    slots = [t[p // block_size] * block_size + p % block_size for t, p in zip(tables, positions, strict=True)]
    n = len(contexts)
    return StepMetadata(
        positions=torch.tensor(positions), slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor(tables, dtype=torch.int32), cu_seqlens_q=torch.arange(n + 1, dtype=torch.int32),
        context_lens=torch.tensor(contexts, dtype=torch.int32), logits_indices=torch.arange(n),
    )


def test_static_inputs_hold_the_step_and_pad_the_rest():
    inputs = StaticDecodeInputs(8, 6, torch.device("cpu"))
    inputs.slot_mapping[:] = 99  # stale values of an earlier, larger step
    meta = _decode_meta([5, 9, 2], 4, [[3, 1], [0, 2, 7], [4]] and [[3, 1, 0], [0, 2, 7], [4, 0, 0]])
    inputs.fill(torch.tensor([11, 12, 13]), meta, rows=4)
    ids, view = inputs.views(4)
    assert ids.tolist() == [11, 12, 13, 0]
    assert view.positions.tolist() == [4, 8, 1, 0] and view.context_lens.tolist() == [5, 9, 2, 0]
    assert view.slot_mapping.tolist() == [1 * 4 + 0, 7 * 4 + 0, 4 * 4 + 1, -1]  # padding writes nothing
    assert view.block_tables[:3, :3].tolist() == meta.block_tables.tolist()
    assert view.cu_seqlens_q.tolist() == [0, 1, 2, 3, 4] and view.logits_indices.tolist() == [0, 1, 2, 3]
    assert inputs.slot_mapping[4:].tolist() == [99] * 4  # rows past the bucket are not the graph's
    with pytest.raises(ValueError, match="does not fit"):
        inputs.fill(torch.zeros(5, dtype=torch.int64), _decode_meta([1] * 5, 4, [[0]] * 5), rows=4)


@pytest.fixture
def runner(tiny_checkpoint):
    return ModelRunner(tiny_checkpoint, RunnerConfig(64, 4, "cpu", num_threads=1, step="eager", max_num_seqs=8))


def _prefill(runner, prompts: list[list[int]], tables: list[list[int]]) -> None:
    for prompt, table in zip(prompts, tables, strict=True):
        n = len(prompt)
        meta = StepMetadata(
            positions=torch.arange(n), slot_mapping=torch.tensor([table[p // 4] * 4 + p % 4 for p in range(n)]),
            block_tables=torch.tensor([table], dtype=torch.int32), cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32),
            context_lens=torch.tensor([n], dtype=torch.int32), logits_indices=torch.tensor([n - 1]),
        )
        with torch.inference_mode():
            runner.model.forward(torch.tensor(prompt), meta, runner.kv_cache)


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
def test_a_padded_decode_step_equals_the_unpadded_one_and_writes_nothing_more(tiny_checkpoint, kernels):
    runner = ModelRunner(tiny_checkpoint, RunnerConfig(64, 4, "cpu", num_threads=1, step="eager", kernels=kernels))
    tables = [[5, 2, 9], [7, 1, 0]]
    _prefill(runner, [[3, 4, 5, 6, 7, 8], [9, 10, 11]], tables)
    meta = _decode_meta([7, 4], 4, tables)
    ids = torch.tensor([40, 41])
    before = [k.clone() for k in runner.kv_cache.k]
    with torch.inference_mode():
        plain = runner.model.forward(ids, meta, runner.kv_cache)
        after_plain = [k.clone() for k in runner.kv_cache.k]
        for k, b in zip(runner.kv_cache.k, before, strict=True):
            k.copy_(b)
        inputs = StaticDecodeInputs(8, runner.max_blocks, torch.device("cpu"))
        inputs.fill(ids, meta, rows=8)
        padded = runner.model.forward(*inputs.views(8), runner.kv_cache)
    # Rows are independent up to fp32 summation order: the matmul blocks 2 and 8 rows differently, and
    # how depends on torch's CPU dispatch (1.8e-5 apart with ATEN_CPU_CAPABILITY=default, 6e-6 on an
    # AVX2 EPYC, 0 on an AVX-512 Xeon); a row mixing into another is off by O(1).
    torch.testing.assert_close(padded[:2], plain, atol=1e-4, rtol=1e-4)
    assert torch.isfinite(padded).all()  # padding rows compute garbage, but finite garbage
    written = torch.zeros(64 * 4, dtype=torch.bool)
    written[meta.slot_mapping] = True
    for k, b, a in zip(runner.kv_cache.k, before, after_plain, strict=True):
        flat, flat_before, flat_plain = k.flatten(0, 1), b.flatten(0, 1), a.flatten(0, 1)
        assert torch.equal(flat[~written], flat_before[~written])  # the six padding rows stored nothing
        torch.testing.assert_close(flat[written], flat_plain[written])


class _ReplayingGraph:
    """Stands in for a CUDA graph on CPU: replay() reruns the captured forward into the same output."""

    def __init__(self, run, output):
        self.run, self.output, self.replays = run, output, 0

    def replay(self):
        self.replays += 1
        self.output.copy_(self.run())

    def pool(self):
        return "pool"


def _stand_in_capture(run, pool):
    output = run()
    return _ReplayingGraph(run, output), output


def test_graph_replay_serves_every_batch_size_from_its_bucket(runner):
    graphs = CudaGraphDecode(runner.model, runner.kv_cache, max_num_seqs=8, max_blocks=runner.max_blocks,
                             capture=_stand_in_capture)
    assert not graphs.is_warm
    graphs.warm_up()
    assert graphs.is_warm and sorted(graphs.graphs) == [1, 2, 4, 8]
    tables = [[5, 2, 9], [7, 1, 0], [3, 0, 0]]
    _prefill(runner, [[3, 4, 5, 6, 7, 8], [9, 10, 11], [12]], tables)
    meta = _decode_meta([7, 4, 2], 4, tables)
    ids = torch.tensor([40, 41, 42])
    snapshot = [k.clone() for k in runner.kv_cache.k]
    with torch.inference_mode():
        eager = runner.model.forward(ids, meta, runner.kv_cache)
        for k, s in zip(runner.kv_cache.k, snapshot, strict=True):
            k.copy_(s)
        replayed = graphs(StepBatch(ids, meta))
    assert graphs.graphs[4].replays == 1 and replayed.shape == eager.shape
    # A bucket of 4 rows is not bit-equal to the 3-row step on every CPU: the matmul may block by
    # M differently (exact on an Intel Xeon, 6e-6 apart on an AMD EPYC), as in the padded test above.
    torch.testing.assert_close(replayed, eager)
    with pytest.raises(ValueError, match="no captured decode graph holds 9 rows"):
        graphs(StepBatch(torch.zeros(9, dtype=torch.int64), _decode_meta([1] * 9, 4, [[0]] * 9)))


def _greedy_tokens(runner, prompts, n_new=10):
    """Sequence i generates n_new + i tokens: the decode batch shrinks one by one at the end."""
    engine = Engine(runner, EngineConfig(64, 4, 8, 64), on_step=lambda out: None)
    for i, p in enumerate(prompts):
        engine.add_request(i, p, SamplingParams(temperature=0.0, max_tokens=n_new + i, ignore_eos=True))
    tokens, _, failed, _ = drive(engine)
    assert not failed and engine.block_manager.num_used_blocks == 0
    return [tokens[i] for i in range(len(prompts))]


PROMPTS = [[5, 6, 7, 8, 9, 10], [300, 1, 17], list(range(20, 40)), [42], [7] * 13]


class _SpyGraphs:
    """Decode graphs that run the eager forward and record the batch sizes they were given."""

    def __init__(self, runner, max_rows):
        self.runner, self.max_rows, self.is_warm, self.calls = runner, max_rows, False, []

    def covers(self, batch):  # what CudaGraphDecode covers: pure decode steps that fit
        meta, n = batch.meta, len(batch.input_ids)
        return not batch.hidden and meta.logits_indices.shape[0] == n == meta.context_lens.shape[0] <= self.max_rows

    def __call__(self, batch):
        assert batch.meta.cu_seqlens_q.tolist() == list(range(len(batch.input_ids) + 1))  # one token per sequence
        self.calls.append(len(batch.input_ids))
        return self.runner.model.forward(batch.input_ids, batch.meta, self.runner.kv_cache)


def test_the_runner_uses_its_step_only_when_warm_and_for_the_batches_it_covers(runner):
    runner.step = graphs = _SpyGraphs(runner, max_rows=4)
    _greedy_tokens(runner, PROMPTS[:2], n_new=3)
    assert graphs.calls == []  # not warm: never compiles inside a step
    graphs.is_warm = True
    _greedy_tokens(runner, PROMPTS, n_new=3)  # 5 sequences: decode steps of 5 rows run eager
    assert graphs.calls and set(graphs.calls) <= {1, 2, 3, 4}


def test_the_compiled_step_gives_the_eager_tokens_without_recompiling(tiny_checkpoint):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager = _greedy_tokens(ModelRunner(tiny_checkpoint, RunnerConfig(64, 4, "cpu", num_threads=1, step="eager")), PROMPTS)
    runner = ModelRunner(tiny_checkpoint, RunnerConfig(64, 4, "cpu", num_threads=1, max_num_seqs=8))
    assert isinstance(runner.step, CompiledStep)  # the default for HF weights on the cpu kernels
    runner.step = spy = _CountingStep(CompiledStep(runner.model, runner.kv_cache, backend="aot_eager"))
    runner.warm_up()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert frames == 1  # one graph for every step
    assert spy.step.direct is not None  # served without Dynamo's per-call entry (graph_call.py)
    spy.step.direct = _CountingDirect(spy.step.direct)
    # prefill steps of 1..20 tokens mixed with decode rows, decode steps of 5..1 rows, tables 1..6 wide
    assert _greedy_tokens(runner, PROMPTS) == eager
    assert spy.prefill_steps and spy.decode_steps  # every step ran the compiled graph
    assert _greedy_tokens(runner, [PROMPTS[0]]) == [eager[0]]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames  # no recompile while serving
    assert spy.step.direct.calls == spy.prefill_steps + spy.decode_steps  # every step took the direct call


class _CountingDirect:
    def __init__(self, direct):
        self.direct, self.calls = direct, 0

    def accepts(self, input_ids, meta):
        return self.direct.accepts(input_ids, meta)

    def __call__(self, input_ids, meta):
        self.calls += 1
        return self.direct(input_ids, meta)


def test_embedding_steps_run_eager_next_to_the_compiled_generation_steps(tiny_checkpoint):
    """An embedding request needs final hidden states, not logits: the steps holding its prompt run
    the eager model (generation rows in them too), every other step the compiled graph; vectors and
    tokens are those of an eager runner."""

    def serve(runner):
        engine = Engine(runner, EngineConfig(64, 4, 8, 16), on_step=lambda out: None)
        engine.add_request("gen", PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
        engine.add_request("emb", list(range(50, 90)), SamplingParams(embedding=Embedding()))  # 40 tokens: 3 chunks
        tokens, completed, failed, steps = drive(engine)
        assert not failed and engine.block_manager.num_used_blocks == 0
        (vector,) = [t.data for out in steps for t in out.tensors if t.key == "emb"]
        return tokens["gen"], torch.frombuffer(bytearray(vector), dtype=torch.float32)

    eager_tokens, eager_vector = serve(ModelRunner(tiny_checkpoint, RunnerConfig(64, 4, "cpu", num_threads=1,
                                                                                 step="eager")))
    torch._dynamo.reset()
    runner = ModelRunner(tiny_checkpoint, RunnerConfig(64, 4, "cpu", num_threads=1, max_num_seqs=8))
    runner.step = spy = _CountingStep(CompiledStep(runner.model, runner.kv_cache, backend="aot_eager"))
    runner.warm_up()
    tokens, vector = serve(runner)
    assert tokens == eager_tokens
    torch.testing.assert_close(vector, eager_vector, atol=1e-6, rtol=0)
    assert spy.decode_steps  # the generation steps after the embedding ended ran the graph


class _CountingStep:
    """Wraps a CompiledStep, counting the prefill-bearing and the pure decode steps it ran."""

    def __init__(self, step):
        self.step, self.prefill_steps, self.decode_steps = step, 0, 0

    def __getattr__(self, name):
        return getattr(self.step, name)

    def __call__(self, batch):
        if len(batch.input_ids) == len(batch.meta.context_lens):
            self.decode_steps += 1
        else:
            self.prefill_steps += 1
        return self.step(batch)


def test_a_step_outside_the_graphs_guards_runs_eagerly_instead_of_compiling(runner):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    graphs = CompiledStep(runner.model, runner.kv_cache, backend="aot_eager")
    graphs.warm_up()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    tables = [[5, 2, 9]]
    _prefill(runner, [[3, 4, 5, 6, 7, 8]], tables)
    meta = _decode_meta([7], 4, tables)
    with torch.inference_mode():
        want = runner.model.forward(torch.tensor([40]), meta, runner.kv_cache)
        got = graphs(StepBatch(torch.tensor([40], dtype=torch.int32), meta))  # int32 ids: not what the graph was traced on
    torch.testing.assert_close(got, want)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames  # not compiled inside a step


def test_a_graph_is_never_reused_for_another_runners_cache_or_model(tiny_checkpoint):
    """Dynamo caches graphs per code object (Transformer.forward), shared by every model in the
    process: a runner with another KV-cache size or another model must trace its own."""
    import dataclasses

    from services.generation.weights.random_init import random_checkpoint

    wider = random_checkpoint(dataclasses.replace(tiny_checkpoint.config, hidden_size=128, num_heads=8), seed=1)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for i, (checkpoint, num_blocks) in enumerate([(tiny_checkpoint, 64), (tiny_checkpoint, 32), (wider, 64)]):
        runner = ModelRunner(checkpoint, RunnerConfig(num_blocks, 4, "cpu", num_threads=1, step="eager"))
        runner.step = CompiledStep(runner.model, runner.kv_cache, backend="aot_eager")
        runner.warm_up()
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == i + 1


@pytest.mark.slow  # a cold Inductor compile of the tiny model: ~30-70 s on the 2-core box
def test_the_inductor_compiled_decode_step_gives_the_eager_tokens(tiny_checkpoint):
    eager = _greedy_tokens(ModelRunner(tiny_checkpoint, RunnerConfig(64, 4, "cpu", num_threads=1, step="eager")), PROMPTS)
    runner = ModelRunner(tiny_checkpoint, RunnerConfig(64, 4, "cpu", num_threads=1, max_num_seqs=8))
    runner.warm_up()
    assert isinstance(runner.step, CompiledStep) and runner.step.is_warm
    assert _greedy_tokens(runner, PROMPTS) == eager


def _long_text() -> str:
    """~3.5k tokens of real English that ships with every CPython: its license."""
    import os
    import sys

    path = os.path.join(sys.base_prefix, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "LICENSE.txt")
    if not os.path.exists(path):
        pytest.skip(f"no {path} to read a long text from")
    with open(path) as f:
        return f.read()


@pytest.mark.slow  # ~3-5 min on the shared 2-core box: 500 compiled fp32 decode steps of 4 rows
@pytest.mark.timeout(1200)
def test_compiled_fp32_cpu_kernels_agree_with_the_hf_oracle_over_2k_teacher_forced_tokens():
    """The fp32 path through kernels/cpu and the compiled graph is not bit-equal to HF (the fused
    attention sums in another order; Inductor fuses the norms): it must differ only at ulp level,
    i.e. agree on the top-1 token at >= 99.9 % of 2,000 teacher-forced positions (4 sequences of
    500 tokens, decoded together one position per step, every step the compiled graph)."""
    from test_dtype import teacher_forced_logits

    from services.generation.weights.locate import load_checkpoint
    from services.preprocess.model import load_model

    n_seqs, n = 4, 500
    text = load_model("default").tokenizer.encode(_long_text())
    segments = [text[i * 600 : i * 600 + n + 1] for i in range(n_seqs)]
    assert all(len(seg) == n + 1 for seg in segments)
    checkpoint = load_checkpoint("default")
    oracle = ModelRunner(checkpoint, RunnerConfig(256, 16, "cpu", num_threads=1, dtype="float32", quantization="none"))
    assert oracle.numerics.kernels == "reference"
    want = torch.stack([teacher_forced_logits(oracle, seg, chunk=256)[:n].argmax(-1) for seg in segments], 1)
    del oracle
    runner = ModelRunner(checkpoint, RunnerConfig(256, 16, "cpu", num_threads=1, dtype="float32", quantization="none",
                                                  kernels="cpu"))
    runner.warm_up()
    assert isinstance(runner.step, CompiledStep) and runner.step.is_warm
    blocks_per_seq = -(-(n + 1) // 16)
    tables = torch.arange(n_seqs * blocks_per_seq, dtype=torch.int32).view(n_seqs, blocks_per_seq)
    got = []
    with torch.inference_mode():
        for pos in range(n):  # one position of every sequence per step: each step is the compiled graph
            width = pos // 16 + 1
            meta = StepMetadata(
                positions=torch.full((n_seqs,), pos), slot_mapping=tables[:, pos // 16].long() * 16 + pos % 16,
                block_tables=tables[:, :width], cu_seqlens_q=torch.arange(n_seqs + 1, dtype=torch.int32),
                context_lens=torch.full((n_seqs,), pos + 1, dtype=torch.int32), logits_indices=torch.arange(n_seqs),
            )
            ids = torch.tensor([seg[pos] for seg in segments])
            got.append(runner.forward(ids, meta).argmax(-1))
    agreement = (torch.stack(got) == want).float().mean().item()
    assert agreement >= 0.999, agreement


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_replay_the_eager_triton_tokens(tiny_checkpoint):
    """On the GPU: the captured graphs (Triton kernels inside, padded buckets) give the eager tokens."""
    def cuda_runner(step: str) -> ModelRunner:
        return ModelRunner(tiny_checkpoint, RunnerConfig(64, 4, "cuda", dtype="float32", max_num_seqs=8, step=step))

    eager = _greedy_tokens(cuda_runner("eager"), PROMPTS)
    runner = cuda_runner("auto")
    assert isinstance(runner.step, CudaGraphDecode) and runner.numerics.kernels == "triton"
    runner.warm_up()
    assert sorted(runner.step.graphs) == [1, 2, 4, 8]
    assert _greedy_tokens(runner, PROMPTS) == eager
