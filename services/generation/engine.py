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

The parts, one noun each: engine_commands.py (the commands other threads queue, admission
included), engine_step.py (one step: schedule, run the model, apply the outcomes), postprocess.py
(each request's own work in a step), request_endings.py (finishing and failing requests). This
module is the loop that drives them. The model runner is injected: the engine core imports
neither torch nor grpc (tests/unit/generation/test_core_purity.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from services.common import errors
from services.common.fault_boundary import FaultBoundary
from services.common.serving import ServingState, State
from services.generation import heap
from services.generation.block_manager import BlockManager
from services.generation.draft import DraftModel, check_draft
from services.generation.engine_commands import EngineCommands
from services.generation.engine_step import EngineStep
from services.generation.grammar.compiler import GrammarConfig
from services.generation.grammar.requests import GrammarRequests
from services.generation.outputs import StepOutput
from services.generation.postprocess import Postprocess
from services.generation.request_endings import RequestEndings
from services.generation.sampling_params import SamplingParams
from services.generation.scheduler import Scheduler, SchedulerConfig
from services.generation.sequence import Sequence
from services.generation.speculation import SpeculationConfig, Speculator
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
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)


class Engine:
    def __init__(
        self,
        runner,
        config: EngineConfig,
        on_step: Callable[[StepOutput], None],
        serving: ServingState | None = None,
        draft=None,
    ):
        """runner: ModelRunner or NullRunner (vocab_size, eos_token_ids, max_model_len, vocabulary, run,
        clear_blocks, release_blocks). Without a vocabulary, structured output is refused (STRUCTURED_OUTPUT_UNAVAILABLE).
        serving: the process's state (a private one, STARTING, when absent: tests, benchmarks).
        draft: the draft model's runner (ModelRunner + greedy_tokens) for --speculative draft
        (draft.py): its own KV pool of config.num_blocks blocks."""
        self.runner = runner
        self.config = config
        kv_cache = getattr(runner, "kv_cache", None)  # a NullRunner has none
        self.block_manager = BlockManager(config.num_blocks, config.block_size,
                                          bound_resident=bool(kv_cache and kv_cache.resident_on_write),
                                          window=getattr(runner, "window", 0),  # a NullRunner: none
                                          reuse_passed=getattr(runner, "every_layer_windowed", False),
                                          max_chunk_tokens=config.max_num_batched_tokens)
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, config.long_prefill_token_threshold),
            self.block_manager,
        )
        self.on_step = on_step
        self.serving = serving or ServingState("engine")
        self.seqs: dict[Hashable, Sequence] = {}  # in flight, by key: the parts below share this dict
        self.stats = EngineStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_done: Future | None = None
        self._is_stalled = False  # the last step found nothing it could schedule
        self._held: StepOutput | None = None  # the last step's output, until the next step launches
        self.heap_release = heap.IdleRelease(release=self._release_idle_memory)
        # A compiled grammar wakes the loop with a command (self._commands is built just below).
        self.grammars = GrammarRequests(runner, config.grammar, lambda *ready: self._commands.put("grammar", *ready))
        # Per-request work fails only its request (docs/design.md "Fault containment").
        self.boundary = FaultBoundary("engine", log)
        self.endings = RequestEndings(self.seqs, self.scheduler, self.block_manager, runner, self.stats,
                                      self.boundary)
        self._commands = EngineCommands(self.seqs, self.scheduler, self.block_manager, runner, self.grammars,
                                        self.serving, self.stats, self.endings)
        self.postprocess = Postprocess(runner, self.grammars, self.boundary)
        self._step = EngineStep(self.scheduler, self.block_manager, runner, self.postprocess, self.stats,
                                self.endings, on_launch=self._report_held,
                                speculator=Speculator(config.speculation, runner.max_model_len,
                                                      getattr(runner, "verify_rows_exact", False),
                                                      self._draft_model(draft, runner, config)))

    @staticmethod
    def _draft_model(draft, runner, config: EngineConfig) -> DraftModel | None:
        if draft is None:
            return None
        check_draft(draft, runner)
        return DraftModel(draft, config.num_blocks, config.block_size)

    @property
    def speculator(self) -> Speculator:
        return self._step.speculator

    # -- thread-safe API ----------------------------------------------------------------------

    def add_request(self, key: Hashable, prompt_token_ids: list[int], params: SamplingParams, input_done=True,
                    images: list | None = None):
        """images: image_inputs.ImageInput of a vision-language prompt, in prompt order (its image
        tokens take their embeddings; the input must be complete)."""
        self._commands.put("add", key, list(prompt_token_ids), params, input_done, time.monotonic(), images)

    def append(self, key: Hashable, token_ids: list[int], input_done: bool, max_tokens: int | None = None) -> None:
        """More prompt tokens; with the last ones (`input_done`) optionally the request's max_tokens,
        resolved by preprocess now that the prompt is complete."""
        self._commands.put("append", key, list(token_ids), input_done, time.monotonic(), max_tokens)

    def abort(self, key: Hashable) -> None:
        self._commands.put("abort", key)

    def fail_all(self, error: errors.MstarError) -> None:
        """End every in-flight request with error (end of a drain grace period)."""
        self._commands.put("fail_all", error)

    @property
    def num_unfinished(self) -> int:
        return len(self.seqs)  # a dict's len is safe to read from another thread

    @property
    def num_steps(self) -> int:
        return self._step.num_steps

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
        self._commands.put("wake")
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
            self._commands.apply(out, wait_s=0.0 if self._steps_next() else idle_wait_s)
            if self._may_step() and self.scheduler.has_work():
                self._is_stalled = not self._step(out)
            elif self.serving.state is State.FAILED and self.seqs:
                self.endings.fail_everything(out, self.serving.refusal())
        except Exception as e:  # a crashed step: fail everyone, go NOT_SERVING
            self._die(e, out)
        if self.speculator.draft is not None:  # the draft's K/V of requests that ended (draft.py)
            self.speculator.draft.retain(self.seqs)
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

    def _steps_next(self) -> bool:
        return self._may_step() and self.scheduler.has_work() and not self._is_stalled

    def _may_step(self) -> bool:
        return self.serving.state is not State.FAILED

    def _die(self, exc: BaseException, out: StepOutput) -> None:
        log.exception("engine step failed; failing all requests", exc_info=exc)
        self.serving.fail("ENGINE_FAILED", f"the engine failed: {type(exc).__name__}")
        # The step broke half-way: the scheduler's books cannot be trusted, so nothing is released
        # through them.
        self.endings.fail_everything(out, self.serving.refusal(), release=False)
