"""One engine step: schedule a batch, run the model over it, apply each request's outcome.

The schedule and the model run are shared work: if they raise, the engine fails (the caller,
Engine.run_once, handles that). What follows the model is each request's own work
(postprocess.py, behind the fault boundary); this module applies its outcomes (tokens,
embeddings, finishing, failing) outside the boundary, so a fault while applying them is fatal as
it should be (docs/design.md "Fault containment").
"""

from __future__ import annotations

import time
from collections.abc import Callable

from services.common import errors, hop_trace
from services.generation.block_manager import BlockManager
from services.generation.outputs import StepOutput
from services.generation.postprocess import Postprocess
from services.generation.request_endings import RequestEndings
from services.generation.scheduler import Scheduler
from services.generation.sequence import SequenceStatus
from services.generation.speculation import Speculator
from services.generation.stats import EngineStats


class EngineStep:
    def __init__(self, scheduler: Scheduler, block_manager: BlockManager, runner, postprocess: Postprocess,
                 stats: EngineStats, endings: RequestEndings, on_launch: Callable[[], None],
                 speculator: Speculator | None = None):
        """runner: run(seqs, num_new_tokens, sampling, pooling, on_launch) -> the step's rows (a
        ModelRunner or NullRunner, injected: the engine imports no torch). on_launch: called by the
        runner right before the model runs, once the step's inputs are prepared."""
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.runner = runner
        self.postprocess = postprocess
        self.stats = stats
        self.endings = endings
        self.on_launch = on_launch
        self.speculator = speculator  # proposes tokens for decoding sequences to verify (speculation.py)
        self.num_steps = 0  # steps whose model ran

    def __call__(self, out: StepOutput) -> bool:
        """Schedule and run one step; False when nothing could be scheduled and nothing changed."""
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        batch = self.scheduler.schedule()
        now = time.monotonic()
        for seq in batch.preempted:
            seq.timing.preempted_at = now
        for seq in batch.unfittable:
            self.endings.fail(out, seq, errors.resource_exhausted(
                "it needs more KV blocks than the pool has", "KV_CACHE_TOO_SMALL", None))
        if not batch:
            return bool(batch.preempted or batch.unfittable)
        # A verify step (speculation.py) computes its last token and its proposal: the proposal's
        # tokens are not the sequence's yet, and each of them gets a logits row too.
        real = [n - len(seq.proposal) for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)]
        ends = [seq.is_sampling_step(n) for seq, n in zip(batch.seqs, real, strict=True)]
        # An embedding request pools where a generation request samples, and then it is done.
        pooling = [end and seq.is_embedding for seq, end in zip(batch.seqs, ends, strict=True)]
        sampling = [(1 + len(seq.proposal)) * (end and not pool)
                    for seq, end, pool in zip(batch.seqs, ends, pooling, strict=True)]
        for seq in batch.seqs:
            t = seq.timing
            if t.first_scheduled is None:
                t.first_scheduled = now
            if t.preempted_at is not None:
                t.preempted_s += now - t.preempted_at
                t.preempted_at = None
        outputs_before = {seq.key: seq.num_output_tokens for seq in batch.seqs if seq.proposal}
        started_ns = time.time_ns() if hop_trace.ON else 0
        rows = self.runner.run(batch.seqs, batch.num_new_tokens, sampling, pooling, on_launch=self.on_launch)
        done = time.monotonic()
        self.num_steps += 1
        out.num_batched_tokens = batch.num_tokens
        self.stats.num_batched_tokens_total += batch.num_tokens
        for seq, n, is_sampling, is_pooling in zip(batch.seqs, real, sampling, pooling, strict=True):
            if seq.is_prefill_step():
                seq.timing.prefill_s += done - now
            seq.num_computed_tokens += n
            self.block_manager.register_computed_blocks(seq)
            self.block_manager.pass_window(seq)
            if not (is_sampling or is_pooling):
                out.prefilling.append(seq.key)
        # The model ran (shared work, fatal if it raised); the rest is each request's own work.
        for outcome in self.postprocess(rows, batch.seqs, sampling, pooling, done):
            seq = outcome.seq
            if outcome.error is not None:
                self.endings.fail(out, seq, outcome.error)
                continue
            if outcome.tensor is not None:
                out.tensors.append(outcome.tensor)
            if outcome.token is not None:
                out.tokens.append(outcome.token)
                self.stats.num_generated_tokens += 1
            if outcome.finish_reason is not None:
                self.endings.finish(out, seq, outcome.finish_reason)
        for seq in batch.seqs:
            if seq.proposal:
                self._settle_verified(seq, outputs_before[seq.key])
        if self.block_manager.window:  # K/V the sliding-window layers never read again
            self.runner.release_window_blocks(self.block_manager.take_window_releases())
        if hop_trace.ON:  # bench/hops.py: the step's run (model + sampling), start as extra
            hop_trace.mark("step", "", out.step, started_ns)
        return True

    def _settle_verified(self, seq, outputs_before: int) -> None:
        """After a verify step: the K/V of the accepted proposals is final (every output token but
        the last one, which the next step feeds), the rest is overwritten by that step."""
        accepted = seq.num_output_tokens - outputs_before - 1
        self.stats.num_spec_proposed += len(seq.proposal)
        self.stats.num_spec_accepted += max(accepted, 0)
        self.speculator.adapt(seq, len(seq.proposal), max(accepted, 0), self.speculator.config.num_tokens)
        seq.proposal = ()
        if seq.status is SequenceStatus.RUNNING and accepted > 0:
            seq.num_computed_tokens = len(seq) - 1
            self.block_manager.register_computed_blocks(seq)
            self.block_manager.pass_window(seq)
