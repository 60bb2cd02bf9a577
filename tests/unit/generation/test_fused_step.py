"""The fused decoder stack (fused_step.py over KernelOps.decoder_stack): what the per-op path
computes, for any step; a row's result independent of its batch-mates and of the thread count;
chosen by the runner for a GGUF served as its codes, and nowhere else (step_choice.py)."""

import pytest
import torch
from generation_helpers import drive

from kernels.dispatch import KernelOps
from services.generation.compiled_step import CompiledStep
from services.generation.engine import Engine, EngineConfig
from services.generation.fused_step import FusedStep
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.models.llama import StepMetadata
from services.generation.sampling_params import SamplingParams
from services.generation.step import EagerStep, StepBatch
from services.generation.weights.gguf import load_gguf
from services.generation.weights.random_init import TINY, random_checkpoint, save_gguf

BLOCK = 4


@pytest.fixture(scope="module", params=["Q4_1", "Q8_0"])
def gguf(request, tmp_path_factory):
    checkpoint = random_checkpoint(TINY, seed=4, std=0.3)
    return load_gguf(save_gguf(checkpoint, str(tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf"),
                               request.param))


def _runner(checkpoint, **kw) -> ModelRunner:
    runner = ModelRunner(checkpoint, RunnerConfig(64, BLOCK, "cpu", num_threads=1, **kw))
    runner.warm_up()
    return runner


def _step(seqs: list[tuple[list[int], int, list[int]]], hidden: bool = False) -> StepBatch:
    """seqs: (new token ids, tokens already cached, cache blocks) each; every row's logits (or hidden states)."""
    ids, positions, slots, lens, cu = [], [], [], [], [0]
    width = max(len(blocks) for _, _, blocks in seqs)
    for new, cached, blocks in seqs:
        for i in range(len(new)):
            p = cached + i
            positions.append(p)
            slots.append(blocks[p // BLOCK] * BLOCK + p % BLOCK)
        ids += new
        lens.append(cached + len(new))
        cu.append(cu[-1] + len(new))
    tables = [blocks + [0] * (width - len(blocks)) for _, _, blocks in seqs]
    meta = StepMetadata(torch.tensor(positions), torch.tensor(slots), torch.tensor(tables, dtype=torch.int32),
                        torch.tensor(cu, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32),
                        torch.arange(len(ids)))
    return StepBatch(torch.tensor(ids), meta, hidden)


def _prefill(runner, prompts_and_blocks) -> None:
    with torch.inference_mode():
        for prompt, blocks in prompts_and_blocks:
            runner.eager(_step([(prompt, 0, blocks)]))


A, B = ([5, 9, 13, 2, 7, 31], [0, 1]), ([40, 41, 42], [2, 3])
MIXED = [([17], 6, A[1]), ([3, 4, 6, 8, 10], 3, B[1])]  # A's decode row, B's 5-token prefill chunk


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "float32"])
def test_the_fused_stack_computes_what_the_per_op_path_computes(gguf, kv_cache_dtype):
    runner = _runner(gguf, kv_cache_dtype=kv_cache_dtype)
    assert isinstance(runner.step, FusedStep)
    _prefill(runner, [A, B])
    batch = _step(MIXED)
    with torch.inference_mode():
        expected = runner.eager(batch)
        k_expected = [k.clone() for k in runner.kv_cache.k]
        v_expected = [v.clone() for v in runner.kv_cache.v]
        got = runner.step(batch)
    # Not bit for bit: RMSNorm and SiLU are Inductor's / torch's on the per-op path.
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    for mine, theirs in zip(runner.kv_cache.k + runner.kv_cache.v, k_expected + v_expected, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-2, atol=1e-3)


def test_a_row_gets_the_same_bits_alone_in_a_batch_and_on_two_threads(gguf):
    runner = _runner(gguf)
    _prefill(runner, [A, B])
    step = runner.step

    def hidden(seqs):
        return step(_step(seqs, hidden=True))

    with torch.inference_mode():  # the stack's output (the dense head's matmul picks kernels by batch size)
        together = hidden(MIXED)
        alone = hidden(MIXED[:1])  # A's decode row again: same position, same cache
        torch.set_num_threads(2)  # a few rows: each thread prepares them all; more: each its share
        on_two = hidden(MIXED), hidden(MIXED[:1])
    assert torch.equal(alone[0], together[0])
    assert torch.equal(on_two[0], together) and torch.equal(on_two[1], alone)


def test_the_runner_fuses_only_a_ggufs_codes(gguf, tiny_checkpoint):
    assert isinstance(_runner(gguf).step, FusedStep)
    assert isinstance(_runner(gguf, step="eager").step, EagerStep)  # --step eager: the per-op path
    forced = ModelRunner(gguf, RunnerConfig(64, BLOCK, "cpu", num_threads=1, step="graph"))  # not warmed: no compile
    assert isinstance(forced.step, CompiledStep)  # forced: the Inductor graph over the codes
    bf16 = ModelRunner(gguf, RunnerConfig(64, BLOCK, "cpu", num_threads=1, dtype="bfloat16"))
    assert bf16.numerics.quantized and isinstance(bf16.step, CompiledStep)  # codes, bf16 activations: a graph
    graph = CompiledStep(bf16.model, bf16.kv_cache, backend="aot_eager")  # traces the C++ embedding lookup too
    graph.warm_up()
    with torch.inference_mode():
        batch = _step([(A[0], 0, A[1])])
        assert torch.equal(graph(batch).argmax(-1), bf16.eager(batch).argmax(-1))
    with pytest.raises(ValueError, match="--step fused needs every projection"):
        ModelRunner(gguf, RunnerConfig(64, BLOCK, "cpu", num_threads=1, dtype="bfloat16", step="fused"))
    assert isinstance(ModelRunner(gguf, RunnerConfig(64, BLOCK, "cpu", num_threads=1, quantization="none",
                                                     kernels="cpu")).step, CompiledStep)
    assert isinstance(ModelRunner(tiny_checkpoint, RunnerConfig(64, BLOCK, "cpu", num_threads=1, kernels="cpu"))
                      .step, CompiledStep)


def test_embedding_steps_ask_for_hidden_states_and_run_eager_next_to_the_fused_stack(gguf):
    """The fused stack returns hidden states when asked, but the runner serves them per op (the
    embeddings' bits stay those of the per-op path): it does not cover a batch asking for them."""
    runner = _runner(gguf)
    _prefill(runner, [A])
    batch, wants_hidden = _step([(B[0], 0, B[1])]), _step([(B[0], 0, B[1])], hidden=True)
    assert runner.step.covers(batch) and not runner.step.covers(wants_hidden)
    with torch.inference_mode():
        fused = runner.step(wants_hidden)
        served = runner.rows(wants_hidden)
        assert torch.equal(served, runner.eager(wants_hidden))
    assert served.shape == (len(B[0]), gguf.config.hidden_size)
    torch.testing.assert_close(fused, served, rtol=1e-3, atol=1e-3)


def test_the_engine_draws_the_per_op_paths_tokens_through_the_fused_stack(gguf):
    def tokens(runner):
        engine = Engine(runner, EngineConfig(64, BLOCK, 8, 32), on_step=lambda out: None)
        for i in range(6):
            engine.add_request(i, [3 + i, 7, 11 + 2 * i, 40, 5][: 2 + i % 4],
                               SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
        out, completed, failed, _ = drive(engine)
        assert not failed and len(completed) == 6 and engine.block_manager.num_used_blocks == 0
        return out

    assert tokens(_runner(gguf)) == tokens(_runner(gguf, step="eager"))


def test_bad_stack_arguments_are_refused_with_the_reason(gguf):
    runner = _runner(gguf)
    step, ops = runner.step, runner.ops
    batch = _step(MIXED[:1])
    ids, meta = batch.input_ids, batch.meta
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match="2 norms"):
            ops.decoder_stack(runner.model.embed(ids), step.norms[:-1], step.weights, runner.kv_cache.k,
                              runner.kv_cache.v, meta.positions, meta.slot_mapping, meta.block_tables,
                              meta.cu_seqlens_q, meta.context_lens, meta.logits_indices, runner.model.cos_sin,
                              *step.heads)
        with pytest.raises(RuntimeError, match="is not a row of 1"):
            ops.decoder_stack(runner.model.embed(ids), step.norms, step.weights, runner.kv_cache.k,
                              runner.kv_cache.v, meta.positions, meta.slot_mapping, meta.block_tables,
                              meta.cu_seqlens_q, meta.context_lens, torch.tensor([1]), runner.model.cos_sin,
                              *step.heads)
        with pytest.raises(RuntimeError, match="projection 1 has"):
            swapped = list(step.weights)
            swapped[1] = swapped[2]
            ops.decoder_stack(runner.model.embed(ids), step.norms, swapped, runner.kv_cache.k, runner.kv_cache.v,
                              meta.positions, meta.slot_mapping, meta.block_tables, meta.cu_seqlens_q,
                              meta.context_lens, meta.logits_indices, runner.model.cos_sin, *step.heads)
        with pytest.raises(NotImplementedError, match="cpu kernel backend only, not reference"):
            KernelOps.create("cpu", backend="reference").decoder_stack(
                runner.model.embed(ids), step.norms, step.weights, runner.kv_cache.k, runner.kv_cache.v,
                meta.positions, meta.slot_mapping, meta.block_tables, meta.cu_seqlens_q, meta.context_lens,
                meta.logits_indices, runner.model.cos_sin, *step.heads)
    assert ops.supports("decoder_stack") and not KernelOps.create("cpu", backend="reference").supports("decoder_stack")
