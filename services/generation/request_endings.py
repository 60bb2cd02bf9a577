"""How a request leaves the engine: finished (its Completion), failed (its Failure), or failed with
every other one when the engine fails. Each request ends exactly once, here; the loop thread only.

Finishing builds the Completion behind the fault boundary (stage "finish"): a fault there fails
that request alone. Removing a request from the scheduler frees its blocks, keeping their prefix
hashes unless what they hold cannot be trusted (non-finite values, a failed engine).
"""

from __future__ import annotations

import time
from collections.abc import Hashable

from services.common import errors
from services.common.fault_boundary import FaultBoundary, RequestFault
from services.common.finish import FinishReason
from services.generation.block_manager import BlockManager
from services.generation.outputs import Failure, StepOutput, completion_of
from services.generation.scheduler import Scheduler
from services.generation.sequence import Sequence, SequenceStatus
from services.generation.stats import EngineStats


class RequestEndings:
    def __init__(self, seqs: dict[Hashable, Sequence], scheduler: Scheduler, block_manager: BlockManager,
                 runner, stats: EngineStats, boundary: FaultBoundary):
        """seqs: the engine's in-flight requests by key (shared: an ended request leaves it here);
        runner: clear_blocks (scrubs a non-finite request's own blocks)."""
        self.seqs = seqs
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.runner = runner
        self.stats = stats
        self.boundary = boundary
        self._wall_offset = time.time() - time.monotonic()  # Completion times are Unix seconds

    def finish(self, out: StepOutput, seq: Sequence, reason: FinishReason) -> None:
        self._remove(seq)
        completion = self.boundary.call("finish", seq.key, completion_of, seq, reason, time.monotonic(),
                                        self._wall_offset)
        if isinstance(completion, RequestFault):
            out.failed.append(Failure(seq.key, completion.error))
            self.stats.num_failed += 1
            return
        out.completed.append(completion)
        self.stats.num_finished += 1

    def fail(self, out: StepOutput, seq: Sequence, error: errors.MstarError) -> None:
        if error.reason == "NON_FINITE_LOGITS":
            # Scrub its own blocks so stale NaN/Inf never reaches a later reader; forget their hashes.
            own = [b for b in seq.block_table if self.block_manager.blocks[b].ref_count == 1]
            self.runner.clear_blocks(own)
            self._remove(seq, keep_cache=False)
        else:
            self._remove(seq)
        out.failed.append(Failure(seq.key, error))
        self.stats.num_failed += 1

    def fail_everything(self, out: StepOutput, error: errors.MstarError | None, release: bool = True) -> None:
        """FAILED: end every request; `release` frees their blocks when the last step completed
        (after a step that broke half-way the scheduler's books cannot be trusted, so nothing is
        released through them: the engine never steps again, the process exits or is restarted)."""
        error = error or errors.unavailable("the engine failed", "ENGINE_FAILED", None)
        for seq in list(self.seqs.values()):
            if release:
                self._remove(seq, keep_cache=False)
            else:
                del self.seqs[seq.key]
            out.failed.append(Failure(seq.key, error))

    def _remove(self, seq: Sequence, keep_cache: bool = True) -> None:
        del self.seqs[seq.key]
        if seq.status != SequenceStatus.FINISHED:
            self.scheduler.remove(seq, keep_cache=keep_cache)
