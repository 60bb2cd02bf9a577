"""Drive an engine on the test thread (named uniquely: test dirs share sys.path)."""

from __future__ import annotations

import dataclasses

from services.generation.engine import Engine, EngineConfig
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.speculation import SpeculationConfig
from services.generation.weights.random_init import TINY, random_checkpoint, synthetic_vocabulary


def make_engine(checkpoint, num_blocks=64, block_size=4, max_num_seqs=32, max_num_batched_tokens=64,
                speculation: SpeculationConfig | None = None, draft_checkpoint=None, **runner_kw):
    """runner_kw: RunnerConfig fields (dtype, quantization, kernels, ...); eager unless warmed up.
    draft_checkpoint: a draft model (speculation mode "draft"), run on the same RunnerConfig."""
    config = RunnerConfig(num_blocks, block_size, "cpu", num_threads=1, **runner_kw)
    runner = ModelRunner(checkpoint, config)
    draft = ModelRunner(draft_checkpoint, config) if draft_checkpoint is not None else None
    engine_config = EngineConfig(num_blocks, block_size, max_num_seqs, max_num_batched_tokens,
                                 speculation=speculation or SpeculationConfig())
    return Engine(runner, engine_config, on_step=lambda out: None, draft=draft)


def drive(engine: Engine, max_steps: int = 10_000, idle_wait_s: float = 0.0):
    """Run the engine on this thread until every request ended; collect what it reported.
    idle_wait_s: how long an iteration without work waits for a command (a compiled grammar)."""
    tokens: dict = {}
    completed: dict = {}
    failed: dict = {}
    steps = []
    for _ in range(max_steps):
        out = engine.run_once(idle_wait_s)
        steps.append(out)
        for t in out.tokens:
            tokens.setdefault(t.key, []).append(t.token_id)
        for c in out.completed:
            assert c.key not in completed and c.key not in failed, "two terminal events"
            completed[c.key] = c
        for f in out.failed:
            assert f.key not in completed and f.key not in failed, "two terminal events"
            failed[f.key] = f
        if not engine.seqs and engine._commands.empty():
            break
    return tokens, completed, failed, steps


def codes_checkpoint(tmp_path_factory, vocab_size: int, seed: int, num_layers: int = TINY.num_layers):
    """A tiny random GGUF of block codes (Q4_1, a Q8_0 head) through the CPU kernels, as `make run`
    serves: verify rows carry decode rows' bits, so equal seeds give equal draws."""
    from services.generation.weights.gguf import load_gguf
    from services.generation.weights.random_init import save_gguf

    config = dataclasses.replace(TINY, vocab_size=vocab_size, num_layers=num_layers)
    path = str(tmp_path_factory.mktemp("gguf") / f"tiny-{vocab_size}-{seed}-{num_layers}.gguf")
    loaded = load_gguf(save_gguf(random_checkpoint(config, seed=seed, std=0.3), path, "Q4_1", head_type="Q8_0"))
    return dataclasses.replace(loaded, vocabulary=synthetic_vocabulary(vocab_size))
