"""The engine: one thread that loops schedule -> run -> postprocess and reports every step.

Callers on any thread use add_request / append / abort; those only enqueue a command, which the
loop thread applies before its next step, so the scheduler and block manager are only ever touched
by one thread. Each step that produced anything is passed to ``on_step(StepOutput)`` on the loop
thread, in step order: right before the next step's model runs when the engine steps on, else at
once (the servicer forwards it to asyncio with call_soon_threadsafe). Every request ends
with exactly one Completion (finished or cancelled) or Failure, except keys that were never known.

The engine reads the process's one ServingState (services/common/serving.py): it admits requests
while STARTING (the warm-up) or SERVING, refuses them while DRAINING or FAILED, and never steps
once FAILED. A fault in one request's own work (its draw, grammar, token bookkeeping, Completion,
embedding: postprocess.py, behind services/common/fault_boundary.py) fails that request alone with
INTERNAL (REQUEST_FAULT) and the engine steps on. If the shared work raises (the model step, the
scheduler's or block manager's books), the engine marks the state FAILED (ENGINE_FAILED) and every
in-flight request fails with UNAVAILABLE; when something else marks it FAILED (the watchdog, after
a hung step), the loop fails whatever it still holds the next time it runs, which frees the blocks.

Structured output (SamplingParams.structured_output): the constraint is validated at admission and
compiled by grammar/compiler.py on its own thread; the request prefills meanwhile but does not
sample until the compile is done (a "grammar" command wakes the loop). Then each sampled token
advances its matcher; the grammar accepting a stop token (or completing, when the model has none)
finishes the request with reason stop. See docs/design.md "Structured output".

Embeddings (SamplingParams.embedding): a prefill-only request. The step that computes its last
prompt token pools (the runner returns that row's final hidden state, normalized) instead of
sampling; the request then finishes in the same step (a TensorEvent, then its Completion with no
output tokens) and its blocks go back. It is scheduled like any prefill, so it shares steps with
generation traffic. See docs/design.md "Embeddings".
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from services.common import errors, hop_trace
from services.common.fault_boundary import FaultBoundary, RequestFault
from services.common.serving import ServingState, State
from services.generation import heap
from services.generation.block_manager import BlockManager
from services.generation.grammar.compiler import GrammarConfig
from services.generation.grammar.requests import GrammarRequests
from services.generation.outputs import FINISH_CANCELLED, Failure, StepOutput, completion_of
from services.generation.postprocess import Postprocess
from services.generation.request_checks import check_input_end, check_prompt_tokens
from services.generation.sampling_params import SamplingParams, validate_embedding, validate_sampling_params
from services.generation.scheduler import Scheduler, SchedulerConfig
from services.generation.sequence import Sequence, SequenceStatus, Timing
from services.generation.stats import EngineStats
from services.generation.torch_thread import TorchThread

log = logging.getLogger(__name__)

__all__ = ["Engine", "EngineConfig", "SamplingParams", "StepOutput"]


@dataclass
class EngineConfig:
    num_blocks: int = 1024
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    long_prefill_token_threshold: int | None = None  # prefill fairness (scheduler.py); None: half the budget
    idle_wait_s: float = 0.05  # how long an idle loop sleeps between checks for stop
    grammar: GrammarConfig = field(default_factory=GrammarConfig)


class Engine:
    def __init__(
        self,
        runner,
        config: EngineConfig,
        on_step: Callable[[StepOutput], None],
        serving: ServingState | None = None,
    ):
        """runner: ModelRunner or NullRunner (vocab_size, eos_token_ids, max_model_len, vocabulary, run,
        clear_blocks, release_blocks). Without a vocabulary, structured output is refused (STRUCTURED_OUTPUT_UNAVAILABLE).
        serving: the process's state (a private one, STARTING, when absent: tests, benchmarks)."""
        self.runner = runner
        self.config = config
        kv_cache = getattr(runner, "kv_cache", None)  # a NullRunner has none
        self.block_manager = BlockManager(config.num_blocks, config.block_size,
                                          bound_resident=bool(kv_cache and kv_cache.resident_on_write))
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, config.long_prefill_token_threshold),
            self.block_manager,
        )
        self.on_step = on_step
        self.serving = serving or ServingState("engine")
        self.seqs: dict[Hashable, Sequence] = {}
        self.stats = EngineStats()
        self.num_steps = 0
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_done: Future | None = None
        self._next_seq_id = 0
        self._is_stalled = False  # the last step found nothing it could schedule
        self._held: StepOutput | None = None  # the last step's output, until the next step launches
        self._wall_offset = time.time() - time.monotonic()
        self.heap_release = heap.IdleRelease(release=self._release_idle_memory)
        self.grammars = GrammarRequests(runner, config.grammar, lambda *ready: self._commands.put(("grammar", *ready)))
        # Per-request work fails only its request (docs/design.md "Fault containment").
        self.boundary = FaultBoundary("engine", log)
        self.postprocess = Postprocess(runner, self.grammars, self.boundary)

    # -- thread-safe API ----------------------------------------------------------------------

    def add_request(self, key: Hashable, prompt_token_ids: list[int], params: SamplingParams, input_done=True):
        self._commands.put(("add", key, list(prompt_token_ids), params, input_done, time.monotonic()))

    def append(self, key: Hashable, token_ids: list[int], input_done: bool) -> None:
        self._commands.put(("append", key, list(token_ids), input_done, time.monotonic()))

    def abort(self, key: Hashable) -> None:
        self._commands.put(("abort", key))

    def fail_all(self, error: errors.MstarError) -> None:
        """End every in-flight request with error (end of a drain grace period)."""
        self._commands.put(("fail_all", error))

    @property
    def num_unfinished(self) -> int:
        return len(self.seqs)  # a dict's len is safe to read from another thread

    def start(self, thread: TorchThread | None = None) -> None:
        """Run the loop on `thread` (the generation service's, where its runner was built: one
        OpenMP pool, services/generation/torch_thread.py), else on a new daemon thread."""
        if thread is not None:
            self._loop_done = thread.submit(self._loop)
            return
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._commands.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout)
        if self._loop_done is not None:
            wait([self._loop_done], timeout)
        self.grammars.close()

    # -- loop thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            out = self.run_once(self.config.idle_wait_s)
            self._report_held()  # no model ran since it was held (nothing scheduled, or a failure)
            if out:
                self._held = out
                if not self._steps_next():
                    self._report_held()
        self._report_held()

    def _report_held(self) -> None:
        """Hand the held step output to on_step. While the engine goes straight on to the next
        step, it is held until right before that step's model runs (runner.run's on_launch), once
        the step's inputs are prepared: the event loop woken here then works while the engine
        waits at the door of the GIL-free compiled step, not in the middle of its Python
        (docs/design.md, "Threads and the GIL", for what was measured)."""
        out, self._held = self._held, None
        if out is not None:
            self.on_step(out)

    def run_once(self, idle_wait_s: float = 0.0) -> StepOutput:
        """One loop iteration: apply queued commands, run a step if there is work. The loop thread
        calls this; tests may call it directly on an engine that was never started."""
        out = StepOutput(step=self.num_steps)
        try:
            # A step that could schedule nothing (every running request waits for its input or its
            # grammar, and max_num_seqs keeps the queued ones out) waits for a command like an idle
            # loop does, instead of spinning; the command that unblocks it also wakes it.
            self._apply_commands(out, wait_s=0.0 if self._steps_next() else idle_wait_s)
            if self._may_step() and self.scheduler.has_work():
                self._is_stalled = not self._step(out)
            elif self.serving.state is State.FAILED and self.seqs:
                self._fail_everything(out, self.serving.refusal())
        except Exception as e:  # a crashed step: fail everyone, go NOT_SERVING
            self._die(e, out)
        self.stats.update(self)
        self.heap_release.on_iteration(not self.seqs, self.num_steps)  # a burst's freed memory
        return out

    def _release_idle_memory(self) -> bool:
        """Idle after work: the pages of the free KV blocks the block manager reclaims (those that
        cache nothing, and cached ones beyond twice the recent load's need), then the C heap's."""
        if self.block_manager.bound_resident:
            blocks = self.block_manager.reclaim_free_blocks()
            released = self.runner.release_blocks(blocks)
            log.debug("idle: released KV blocks", extra={"blocks": len(blocks), "bytes": released})
        return heap.release()

    def _apply_commands(self, out: StepOutput, wait_s: float) -> None:
        try:
            command = self._commands.get(timeout=wait_s) if wait_s else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, *args = command
            if kind == "add":
                self._add(out, *args)
            elif kind == "append":
                self._append(out, *args)
            elif kind == "abort":
                self._abort(out, *args)
            elif kind == "grammar":
                self._grammar_ready(out, *args)
            elif kind == "fail_all":
                for seq in list(self.seqs.values()):
                    self._fail(out, seq, args[0])
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _reject(self, out: StepOutput, key: Hashable, error: errors.MstarError) -> None:
        self.stats.num_rejections += 1
        out.failed.append(Failure(key, error))

    def _add(self, out, key, token_ids, params: SamplingParams, input_done: bool, arrival: float) -> None:
        if key in self.seqs:
            # The running request keeps going; the duplicate alone is refused.
            out.failed.append(Failure(key, errors.already_exists("a request with this id is already running")))
            return
        if not self.serving.accepts_work:
            self._reject(out, key, self.serving.refusal())
            return
        message = validate_sampling_params(params, self.runner.vocab_size)
        error = errors.invalid_argument("sampling", message) if message else None
        message = None if error else validate_embedding(params, self.runner.hidden_size)
        error = error or (errors.invalid_argument("embedding", message) if message else None)
        error = error or self.grammars.check(params)
        error = error or check_prompt_tokens(token_ids, len(token_ids), self.runner, self.block_manager,
                                             output_tokens=0 if params.embedding is not None else 1)
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        seq = Sequence(key, self._next_seq_id, token_ids, params, seed, Timing(arrival, arrival), input_done)
        if error is None and input_done:
            error = check_input_end(seq, self.runner, self.block_manager)
        if error is None and params.structured_output is not None:
            error = self.grammars.start(seq)
        if error is not None:
            self._reject(out, key, error)
            return
        self._next_seq_id += 1
        self.seqs[key] = seq
        self.scheduler.add(seq)

    def _grammar_ready(self, out: StepOutput, key: Hashable, seq_id: int, future: Future) -> None:
        seq = self.seqs.get(key)
        if seq is None or seq.seq_id != seq_id:
            return  # aborted or failed meanwhile (the key may even be reused by a newer request)
        error = self.grammars.attach(seq, future)
        if error is not None:
            self._fail(out, seq, error)

    def _append(self, out, key, token_ids, input_done: bool, when: float) -> None:
        seq = self.seqs.get(key)
        if seq is None:
            return  # finished or aborted meanwhile: nothing to add to
        if seq.is_input_done:
            self._fail(out, seq, errors.failed_precondition("its input already ended", "INPUT_ENDED"))
            return
        error = check_prompt_tokens(token_ids, seq.num_prompt_tokens + len(token_ids), self.runner, self.block_manager,
                                    output_tokens=0 if seq.is_embedding else 1)
        if error is None:
            seq.append_prompt(token_ids)
            if input_done:
                seq.is_input_done = True
                seq.timing.ingest = when
                error = check_input_end(seq, self.runner, self.block_manager)
        if error is not None:
            self._fail(out, seq, error)

    def _abort(self, out: StepOutput, key: Hashable) -> None:
        seq = self.seqs.get(key)
        if seq is not None:
            self._finish(out, seq, FINISH_CANCELLED)

    def _step(self, out: StepOutput) -> bool:
        """Schedule and run one step; False when nothing could be scheduled and nothing changed."""
        batch = self.scheduler.schedule()
        now = time.monotonic()
        for seq in batch.preempted:
            seq.timing.preempted_at = now
        for seq in batch.unfittable:
            self._fail(out, seq, errors.resource_exhausted(
                "it needs more KV blocks than the pool has", "KV_CACHE_TOO_SMALL", None))
        if not batch:
            return bool(batch.preempted or batch.unfittable)
        ends = [seq.is_sampling_step(n) for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)]
        # An embedding request pools where a generation request samples, and then it is done.
        pooling = [end and seq.is_embedding for seq, end in zip(batch.seqs, ends, strict=True)]
        sampling = [end and not pool for end, pool in zip(ends, pooling, strict=True)]
        for seq in batch.seqs:
            t = seq.timing
            if t.first_scheduled is None:
                t.first_scheduled = now
            if t.preempted_at is not None:
                t.preempted_s += now - t.preempted_at
                t.preempted_at = None
        started_ns = time.time_ns() if hop_trace.ON else 0
        rows = self.runner.run(batch.seqs, batch.num_new_tokens, sampling, pooling, on_launch=self._report_held)
        done = time.monotonic()
        self.num_steps += 1
        out.num_batched_tokens = batch.num_tokens
        self.stats.num_batched_tokens_total += batch.num_tokens
        for seq, n, is_sampling, is_pooling in zip(batch.seqs, batch.num_new_tokens, sampling, pooling, strict=True):
            if seq.is_prefill_step():
                seq.timing.prefill_s += done - now
            seq.num_computed_tokens += n
            self.block_manager.register_computed_blocks(seq)
            if not (is_sampling or is_pooling):
                out.prefilling.append(seq.key)
        # The model ran (shared work, fatal if it raised); the rest is each request's own work.
        for outcome in self.postprocess(rows, batch.seqs, sampling, pooling, done):
            seq = outcome.seq
            if outcome.error is not None:
                self._fail(out, seq, outcome.error)
                continue
            if outcome.tensor is not None:
                out.tensors.append(outcome.tensor)
            if outcome.token is not None:
                out.tokens.append(outcome.token)
                self.stats.num_generated_tokens += 1
            if outcome.finish_reason is not None:
                self._finish(out, seq, outcome.finish_reason)
        if hop_trace.ON:  # bench/hops.py: the step's run (model + sampling), start as extra
            hop_trace.mark("step", "", out.step, started_ns)
        return True

    def _remove(self, seq: Sequence, keep_cache: bool = True) -> None:
        del self.seqs[seq.key]
        if seq.status != SequenceStatus.FINISHED:
            self.scheduler.remove(seq, keep_cache=keep_cache)

    def _finish(self, out: StepOutput, seq: Sequence, reason: str) -> None:
        self._remove(seq)
        completion = self.boundary.call("finish", seq.key, completion_of, seq, reason, time.monotonic(),
                                        self._wall_offset)
        if isinstance(completion, RequestFault):
            out.failed.append(Failure(seq.key, completion.error))
            self.stats.num_failed += 1
            return
        out.completed.append(completion)
        self.stats.num_finished += 1

    def _fail(self, out: StepOutput, seq: Sequence, error: errors.MstarError) -> None:
        if error.reason == "NON_FINITE_LOGITS":
            # Scrub its own blocks so stale NaN/Inf never reaches a later reader; forget their hashes.
            own = [b for b in seq.block_table if self.block_manager.blocks[b].ref_count == 1]
            self.runner.clear_blocks(own)
            self._remove(seq, keep_cache=False)
        else:
            self._remove(seq)
        out.failed.append(Failure(seq.key, error))
        self.stats.num_failed += 1

    def _steps_next(self) -> bool:
        return self._may_step() and self.scheduler.has_work() and not self._is_stalled

    def _may_step(self) -> bool:
        return self.serving.state is not State.FAILED

    def _die(self, exc: BaseException, out: StepOutput) -> None:
        log.exception("engine step failed; failing all requests", exc_info=exc)
        self.serving.fail("ENGINE_FAILED", f"the engine failed: {type(exc).__name__}")
        # The step broke half-way: the scheduler's books cannot be trusted, so nothing is released
        # through it (the engine never steps again; the process exits or is restarted).
        self._fail_everything(out, self.serving.refusal(), release=False)

    def _fail_everything(self, out: StepOutput, error: errors.MstarError | None, release: bool = True) -> None:
        """FAILED: end every request; `release` frees their blocks when the last step completed."""
        error = error or errors.unavailable("the engine failed", "ENGINE_FAILED", None)
        for seq in list(self.seqs.values()):
            if release:
                self._remove(seq, keep_cache=False)
            else:
                del self.seqs[seq.key]
            out.failed.append(Failure(seq.key, error))
